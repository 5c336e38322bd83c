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

func TestExpSweep(t *testing.T) {
	hs := strings.Split(os.Getenv("EXP_H"), ",")
	keep := os.Getenv("EXP_KEEP") == "1"
	only := os.Getenv("EXP_TRACE")
	tf, _ := strconv.ParseFloat(os.Getenv("EXP_TF"), 64)
	mf, _ := strconv.ParseFloat(os.Getenv("EXP_MF"), 64)
	ratios := []float64{0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}
	for _, tc := range sharedtraces.ForTest(t) {
		if only != "" && !strings.Contains(tc.Name, only) {
			continue
		}
		tr := loadTrace(t, tc.Path)
		base, err := Run(tr, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, hn := range hs {
			h, err := evict.ParseHeuristic(hn)
			if err != nil {
				t.Fatal(err)
			}
			line := fmt.Sprintf("%-15s %-10s", tc.Name, hn)
			for _, r := range ratios {
				res, err := Run(tr, Options{Budget: uint64(float64(base.Peak) * r), Engine: evict.Config{Heuristic: h, SimulatorCompat: keep, RecompTimeFactor: tf, RecompMemoryFactor: mf}, Check: os.Getenv("EXP_CHECK") == "1"})
				if err != nil {
					t.Fatal(err)
				}
				cell := fmt.Sprintf("%.3f", res.Overhead)
				if res.Status != OK {
					cell = res.Status.String()
				}
				line += fmt.Sprintf(" %8s(%4.1fs)", cell, res.Wall.Seconds())
			}
			fmt.Println(line)
		}
	}
}
