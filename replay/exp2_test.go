package replay

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/sharedtraces"
)

func TestExpLog(t *testing.T) {
	only := os.Getenv("EXP_TRACE")
	h, _ := evict.ParseHeuristic(os.Getenv("EXP_H"))
	ratio, _ := strconv.ParseFloat(os.Getenv("EXP_R"), 64)
	for _, tc := range sharedtraces.ForTest(t) {
		if !strings.Contains(tc.Name, only) {
			continue
		}
		tr := loadTrace(t, tc.Path)
		base, _ := Run(tr, Options{})
		var log []string
		cfg := evict.Config{Heuristic: h, SimulatorCompat: true, OnEvict: func(v evict.Victim, why evict.EvictReason) {
			log = append(log, tr.Names[v.Tensor]+" "+strconv.Itoa(int(why)))
		}}
		res, err := Run(tr, Options{Budget: uint64(float64(base.Peak) * ratio), Engine: cfg})
		if err != nil {
			t.Fatal(err)
		}
		t.Log(res.Status, res.Overhead, len(log), res.Instructions, len(tr.Instrs), res.Reason)
		for i, n := range tr.Names {
			if n == os.Getenv("EXP_NAME") {
				t.Log("ID", i)
			}
		}
		os.WriteFile("/tmp/oracle/go.log", []byte(strings.Join(log, "\n")), 0o644)
	}
}
