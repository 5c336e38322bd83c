package replay

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memscale/memscale/evict"
	rc "github.com/memscale/memscale/recompute"
)

// trainingTrace is a synthetic training step of n ops: a forward chain of
// n/2 ops (each reads the previous activation and a weight), then a backward
// of n/2 ops that reads activation n/2-i and the running gradient and
// releases both.
func trainingTrace(n int) *rc.Trace {
	var b rc.Builder
	w := b.Constant(1 << 20)
	acts := []int32{b.Constant(1 << 20)}
	for i := 0; i < n/2; i++ {
		out, err := b.Call("fwd", []int32{acts[len(acts)-1], w}, []rc.OutSpec{{Size: uint64(1<<20 + (i%7)<<18), Alias: -1}}, int64(1000+(i%13)*500))
		if err != nil {
			panic(err)
		}
		acts = append(acts, out[0])
	}
	grad := acts[len(acts)-1]
	for i := len(acts) - 2; i >= 1; i-- {
		out, err := b.Call("bwd", []int32{acts[i], grad, w}, []rc.OutSpec{{Size: 1 << 20, Alias: -1}}, int64(2000+(i%11)*500))
		if err != nil {
			panic(err)
		}
		if err := b.Release(acts[i]); err != nil {
			panic(err)
		}
		if err := b.Release(grad); err != nil {
			panic(err)
		}
		grad = out[0]
	}
	return b.Trace()
}

// vmHWM returns the process's peak resident set (VmHWM) in MiB, 0 if unknown.
func vmHWM() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.Atoi(f[1])
			return kb >> 10
		}
	}
	return 0
}

// TestEngineScale replays a synthetic training step of MEMSCALE_SCALE_OPS ops
// at ratio 0.5 with anc-sqrt and dtr-eq and prints seconds and peak RSS
// (bench/results/engine-scale.md). Skipped unless the variable is set.
func TestEngineScale(t *testing.T) {
	ns := os.Getenv("MEMSCALE_SCALE_OPS")
	if ns == "" {
		t.Skip("MEMSCALE_SCALE_OPS not set")
	}
	n, err := strconv.Atoi(ns)
	if err != nil || n < 4 {
		t.Fatalf("MEMSCALE_SCALE_OPS=%q: want a whole number of ops >= 4", ns)
	}
	tr := trainingTrace(n)
	base, err := Run(tr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []evict.Heuristic{evict.AncSqrt, evict.DTREq} {
		t0 := time.Now()
		res, err := Run(tr, Options{Engine: evict.Config{Heuristic: h}, Budget: Budget(0.5, base.Peak), OverheadLimit: -1})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("| %d | %v | %.2f | %d | %v | %.3f | %d |\n", n, h, time.Since(t0).Seconds(), vmHWM(), res.Status, res.Overhead, res.Evictions)
	}
}
