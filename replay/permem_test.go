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
