package replay

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"

	"github.com/memscale/memscale/evict"
	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/require"
)

// liveHeap returns the live heap in bytes after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkMemoryPerOp measures, per op of the synthetic training step
// (trainingTrace, written as a trace log and parsed), the bytes that stay
// live: trace-B/op is the parsed trace (instructions and names), engine-B/op
// what the budgeted replay holds at its end on top of the trace (the
// engine's lineage graph, victim index, tracker, the replay's tensor map),
// parse-alloc-B/op and run-alloc-B/op the bytes allocated by parsing and by
// the budgeted replay (garbage included). One iteration parses and replays
// once; the metrics are the last iteration's.
//
//	go test ./replay -run '^$' -bench MemoryPerOp -benchtime 1x -count 5
func BenchmarkMemoryPerOp(b *testing.B) {
	for _, n := range []int{20000, 200000} {
		var log bytes.Buffer
		require.NoError(b, writeTrainingTrace(&log, n))
		for _, h := range []evict.Heuristic{evict.AncSqrt, evict.DTREq, evict.LRU} {
			b.Run(fmt.Sprintf("ops=%d/%v", n, h), func(b *testing.B) {
				var traceB, engineB, parseA, runA float64
				for i := 0; i < b.N; i++ {
					base := liveHeap()
					var m0, m1 runtime.MemStats
					runtime.ReadMemStats(&m0)
					tr, err := rc.DecodeTrace(bytes.NewReader(log.Bytes()))
					require.NoError(b, err)
					runtime.ReadMemStats(&m1)
					parseA = float64(m1.TotalAlloc-m0.TotalAlloc) / float64(n)
					withTrace := liveHeap()
					traceB = float64(withTrace-base) / float64(n)
					peak, err := Run(tr, Options{})
					require.NoError(b, err)
					var atEnd uint64
					endHook = func(*evict.Engine) { atEnd = liveHeap() }
					runtime.ReadMemStats(&m0)
					res, err := Run(tr, Options{Engine: evict.Config{Heuristic: h}, Budget: Budget(0.5, peak.Peak), OverheadLimit: -1})
					runtime.ReadMemStats(&m1)
					endHook = nil
					require.NoError(b, err)
					require.Equal(b, OK, res.Status)
					runA = float64(m1.TotalAlloc-m0.TotalAlloc) / float64(n)
					engineB = float64(atEnd-withTrace) / float64(n)
					runtime.KeepAlive(tr)
				}
				b.ReportMetric(traceB, "trace-B/op")
				b.ReportMetric(engineB, "engine-B/op")
				b.ReportMetric(parseA, "parse-alloc-B/op")
				b.ReportMetric(runA, "run-alloc-B/op")
			})
		}
	}
}

// TestGraphSizeIsExact checks the counts a replay reserves against what the
// engine's graph holds after an unbudgeted replay (the reference: every op
// recorded once, nothing re-run): the synthetic step and a trace with
// views, copies and in-place ops.
func TestGraphSizeIsExact(t *testing.T) {
	var b rc.Builder
	w := b.Constant(64)
	x := b.Constant(32)
	out, err := b.Call("f", []int32{x, w}, []rc.OutSpec{{Size: 128, Alias: -1}, {Alias: 0}}, 5)
	require.NoError(t, err)
	require.NoError(t, b.Copy(out[0]))
	_, err = b.Mutate("g_", []int32{out[0], w}, []int{0}, 3)
	require.NoError(t, err)
	require.NoError(t, b.Release(out[1]))
	for _, tr := range []*rc.Trace{trainingTrace(400), b.Trace()} {
		var st evict.Stats
		endHook = func(e *evict.Engine) { st = e.Stats() }
		_, err := Run(tr, Options{Check: true})
		endHook = nil
		require.NoError(t, err)
		require.Equal(t, evict.GraphSize{Ops: st.Ops, Tensors: st.Tensors, Storages: st.Storages}, graphSize(tr))
	}
}
