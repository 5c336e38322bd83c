package replay

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/sharedtraces"
)

var refBest = map[string][]float64{
	"resnet32":       {1.332, 1.178, 1.140, 1.106, 1.063, 1.037, 1.024, 1.013},
	"tv_densenet121": {1.465, 1.331, 1.232, 1.164, 1.114, 1.096, 1.053, 1.026},
	"transformer":    {1.333, 1.113, 1.080, 1.058, 1.044, 1.031, 1.018, 1.009},
	"lstm":           {1.550, 1.301, 1.121, 1.065, 1.042, 1.031, 1.027, 1.017},
	"unet":           {0, 1.585, 1.241, 1.132, 1.088, 1.049, 1.033, 1.016},
}

func TestExpScore(t *testing.T) {
	ratios := []float64{0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}
	type tt struct {
		name string
		tr   interface{}
	}
	traces := sharedtraces.ForTest(t)
	loaded := map[string]*struct {
		peak uint64
		tr   any
	}{}
	_ = loaded
	for _, cfgs := range strings.Split(os.Getenv("EXP_CFGS"), ";") {
		parts := strings.Split(cfgs, ",")
		h, _ := evict.ParseHeuristic(parts[0])
		tf, _ := strconv.ParseFloat(parts[1], 64)
		mf, _ := strconv.ParseFloat(parts[2], 64)
		fails, worst := 0, 0.0
		detail := ""
		for _, tc := range traces {
			tr := loadTrace(t, tc.Path)
			base, _ := Run(tr, Options{})
			for i, r := range ratios {
				res, err := Run(tr, Options{Budget: uint64(float64(base.Peak) * r), Engine: evict.Config{Heuristic: h, RecompTimeFactor: tf, RecompMemoryFactor: mf}})
				if err != nil {
					t.Fatal(err)
				}
				ref := refBest[tc.Name][i]
				if ref == 0 {
					continue
				}
				if res.Status != OK || res.Overhead > ref+0.0005 {
					fails++
					ex := res.Overhead - ref
					if res.Status != OK {
						ex = 1
					}
					if ex > worst {
						worst = ex
					}
					detail += fmt.Sprintf(" %s@%.1f:%.3f/%.3f", tc.Name[:4], r, res.Overhead, ref)
				}
			}
		}
		fmt.Printf("%-30s fails=%2d worst=%.3f %s\n", cfgs, fails, worst, detail)
	}
}
