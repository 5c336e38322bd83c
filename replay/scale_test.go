package replay

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memscale/memscale/evict"
	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/require"
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

// cpuSeconds returns the process's CPU time so far (user + system, every
// thread: the collector's too), which a loaded machine inflates far less
// than wall time.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
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

// writeTrainingTrace writes trainingTrace(n)'s program as a DTR trace log
// (the format of the shared traces: a CALL line, then a MEMORY and an ALIAS
// line per result), so that the benchmark times the parser as well.
func writeTrainingTrace(w io.Writer, n int) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	fmt.Fprintln(bw, `{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}`)
	constant := func(name string, size int) {
		fmt.Fprintf(bw, "{\"INSTRUCTION\":\"CONSTANT\",\"NAME\":\"%s\"}\n", name)
		fmt.Fprintf(bw, "{\"INSTRUCTION\":\"MEMORY\",\"MEMORY\":\"%d\",\"NAME\":\"%s\"}\n", size, name)
	}
	call := func(op string, args []string, res string, size int, cost int) {
		fmt.Fprintf(bw, "{\"ARGS\":[\"%s\"],\"INSTRUCTION\":\"CALL\",\"NAME\":\"%s\",\"RESULT\":[\"%s\"],\"TIME\":\"%d\"}\n",
			strings.Join(args, `","`), op, res, cost)
		fmt.Fprintf(bw, "{\"INSTRUCTION\":\"MEMORY\",\"MEMORY\":\"%d\",\"NAME\":\"%s\"}\n", size, res)
		fmt.Fprintf(bw, "{\"ALIAS\":\"-1\",\"INSTRUCTION\":\"ALIAS\",\"NAME\":\"%s\"}\n", res)
	}
	release := func(name string) { fmt.Fprintf(bw, "{\"INSTRUCTION\":\"RELEASE\",\"NAME\":\"%s\"}\n", name) }
	constant("w", 1<<20)
	constant("a0", 1<<20)
	for i := 0; i < n/2; i++ {
		call("fwd", []string{fmt.Sprintf("a%d", i), "w"}, fmt.Sprintf("a%d", i+1), 1<<20+(i%7)<<18, 1000+(i%13)*500)
	}
	grad := fmt.Sprintf("a%d", n/2)
	for i := n/2 - 1; i >= 1; i-- {
		g := fmt.Sprintf("g%d", i)
		call("bwd", []string{fmt.Sprintf("a%d", i), grad, "w"}, g, 1<<20, 2000+(i%11)*500)
		release(fmt.Sprintf("a%d", i))
		release(grad)
		grad = g
	}
	return bw.Flush()
}

// TestTrainingTraceLog checks that the written log parses to the program
// trainingTrace builds: the same baseline and the same budgeted replay.
func TestTrainingTraceLog(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, writeTrainingTrace(&buf, 400))
	parsed, err := rc.DecodeTrace(&buf)
	require.NoError(t, err)
	built := trainingTrace(400)
	require.Equal(t, built.Len(), parsed.Len())
	b1, err := Run(built, Options{})
	require.NoError(t, err)
	b2, err := Run(parsed, Options{})
	require.NoError(t, err)
	require.Equal(t, b1.Peak, b2.Peak)
	require.Equal(t, b1.Compute, b2.Compute)
	r1, err := Run(built, Options{Budget: Budget(0.5, b1.Peak)})
	require.NoError(t, err)
	r2, err := Run(parsed, Options{Budget: Budget(0.5, b1.Peak)})
	require.NoError(t, err)
	require.Equal(t, r1.Overhead, r2.Overhead)
	require.Equal(t, r1.Evictions, r2.Evictions)
}

// TestEngineScale writes a synthetic training step of MEMSCALE_SCALE_OPS ops
// (a comma-separated list) as a trace log, parses it, and replays it at
// ratio 0.5 with each heuristic of MEMSCALE_SCALE_HEURISTICS (default: all),
// printing a Markdown row per run: parse and replay seconds (wall, then
// CPU), microseconds per op (wall), and the process's peak resident set (run one heuristic per
// process for a per-heuristic figure: bench/results/engine-scale.md).
// Skipped unless MEMSCALE_SCALE_OPS is set.
func TestEngineScale(t *testing.T) {
	ns := os.Getenv("MEMSCALE_SCALE_OPS")
	if ns == "" {
		t.Skip("MEMSCALE_SCALE_OPS not set")
	}
	var sizes []int
	for _, f := range strings.Split(ns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 4 {
			t.Fatalf("MEMSCALE_SCALE_OPS=%q: want whole numbers of ops >= 4", ns)
		}
		sizes = append(sizes, n)
	}
	hs := evict.Heuristics()
	if v := os.Getenv("MEMSCALE_SCALE_HEURISTICS"); v != "" {
		hs = nil
		for _, f := range strings.Split(v, ",") {
			h, err := evict.ParseHeuristic(f)
			if err != nil {
				t.Fatalf("MEMSCALE_SCALE_HEURISTICS: %v", err)
			}
			hs = append(hs, h.Resolve())
		}
	}
	for _, n := range sizes {
		path := filepath.Join(t.TempDir(), "scale.log")
		f, err := os.Create(path)
		require.NoError(t, err)
		require.NoError(t, writeTrainingTrace(f, n))
		require.NoError(t, f.Close())
		t0, c0 := time.Now(), cpuSeconds()
		tr, err := rc.LoadTrace(path)
		require.NoError(t, err)
		parse, parseCPU := time.Since(t0).Seconds(), cpuSeconds()-c0
		base, err := Run(tr, Options{})
		require.NoError(t, err)
		for _, h := range hs {
			t0, c0 := time.Now(), cpuSeconds()
			res, err := Run(tr, Options{Engine: evict.Config{Heuristic: h}, Budget: Budget(0.5, base.Peak), OverheadLimit: -1})
			require.NoError(t, err)
			sec, cpu := time.Since(t0).Seconds(), cpuSeconds()-c0
			hwm := vmHWM()
			fmt.Printf("| %d | %v | %.2f | %.2f | %.2f | %.2f | %.2f | %d | %.0f | %v | %.3f | %d |\n", n, h, parse, parseCPU, sec, cpu,
				sec*1e6/float64(n), hwm, float64(hwm)*(1<<20)/float64(n), res.Status, res.Overhead, res.Evictions)
		}
	}
}
