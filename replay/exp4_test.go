package replay

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/sharedtraces"
)

func TestExpTime(t *testing.T) {
	h, _ := evict.ParseHeuristic(os.Getenv("EXP_H"))
	scan := os.Getenv("EXP_SCAN") == "1"
	ratios := []float64{0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}
	t0 := time.Now()
	var search time.Duration
	for _, tc := range sharedtraces.ForTest(t) {
		t1 := time.Now()
		tr := loadTrace(t, tc.Path)
		base, _ := Run(tr, Options{})
		for _, r := range ratios {
			res, err := Run(tr, Options{Budget: uint64(float64(base.Peak) * r), Engine: evict.Config{Heuristic: h, ExactScan: scan}})
			if err != nil {
				t.Fatal(err)
			}
			search += res.VictimSearchTime
		}
		fmt.Println(tc.Name, time.Since(t1))
	}
	fmt.Println("total", time.Since(t0), "victim search", search)
}
