package evict

import (
	"math/rand"
	"slices"
	"testing"
	"time"

	rc "github.com/memscale/memscale/recompute"
)

// benchEngine builds an engine holding n candidate storages: outputs of
// ops that read one or two earlier tensors, with random sizes and costs.
func benchEngine(b *testing.B, cfg Config, n int) (*Engine, *rand.Rand) {
	b.Helper()
	e, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewSource(1))
	live := []rc.TensorID{e.NewTensor(1<<20, true)}
	for i := 0; i < n; i++ {
		benchOp(b, e, rng, &live)
	}
	return e, rng
}

// benchOp runs one op on resident tensors picked among the recent ones.
func benchOp(b *testing.B, e *Engine, rng *rand.Rand, live *[]rc.TensorID) {
	g := e.Graph()
	var ins []rc.TensorID
	for len(ins) < 1+rng.Intn(2) {
		l := *live
		t := l[max(0, len(l)-1-rng.Intn(min(len(l), 64)))]
		if !g.IsResident(t) {
			t = l[0]
		}
		ins = append(ins, t)
	}
	for _, in := range ins {
		if err := e.Access(in); err != nil {
			b.Fatal(err)
		}
	}
	_, ids, err := e.Call("op", ins, []Output{{Size: uint64(1<<20 + rng.Intn(1<<22)), Alias: -1}}, int64(1000+rng.Intn(1_000_000)), 0)
	if err != nil {
		b.Fatal(err)
	}
	*live = append(*live, ids...)
}

// BenchmarkVictimSelection measures choosing a victim among 100,000
// candidates while the engine runs: each iteration picks the victim (timed),
// evicts it, and runs a new op so the candidate count stays the same and the
// clock moves. It reports the median and p99 selection times, and the mean
// time of a whole iteration (ns/step: pick, eviction and the next op, with
// the upkeep the heuristic's tracker does on an eviction and a new op).
func BenchmarkVictimSelection(b *testing.B) {
	for _, tc := range []struct {
		name   string
		h      Heuristic
		scan   bool
		tf, mf float64
	}{
		{"default", Default, false, 0, 0},
		// configurations the auto policy chooses on the DTR traces
		{"anc-sqrt[t=0.5,m=2]", AncSqrt, false, 0.5, 2},
		{"dtr[t=2,m=2]", DTR, false, 2, 2},
		{"dtr-eq-anc", DTREqAnc, false, 0, 0},
		{"dtr-eq", DTREq, false, 0, 0},
		{"dtr", DTR, false, 0, 0},
		{"msps", MSPS, false, 0, 0},
		{"lru", LRU, false, 0, 0},
		{"dtr-local", DTRLocal, false, 0, 0},
		{"default-exact-scan", Default, true, 0, 0},
	} {
		b.Run(tc.name, func(b *testing.B) {
			const n = 100_000
			e, rng := benchEngine(b, Config{Heuristic: tc.h, ExactScan: tc.scan, RecompTimeFactor: tc.tf, RecompMemoryFactor: tc.mf}, n)
			live := make([]rc.TensorID, 0, n)
			for t := 0; t < e.Graph().NumTensors(); t++ {
				live = append(live, rc.TensorID(t))
			}
			times := make([]time.Duration, 0, b.N)
			var steps time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				s, ok := e.pick()
				d := time.Since(t0)
				if !ok {
					b.Fatal("no candidate")
				}
				times = append(times, d)
				b.StopTimer()
				t1 := time.Now()
				e.evictStorage(s)
				benchOp(b, e, rng, &live)
				steps += d + time.Since(t1)
				b.StartTimer()
			}
			b.StopTimer()
			if e.Candidates() < n-n/10 {
				b.Fatalf("only %d candidates", e.Candidates())
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "ns/median-pick")
			b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds()), "ns/p99-pick")
			b.ReportMetric(float64(e.Candidates()), "candidates")
			// the engine's whole work per iteration: pick, eviction and
			// the next op (neighbourhood upkeep included)
			b.ReportMetric(float64(steps.Nanoseconds())/float64(b.N), "ns/step")
		})
	}
}
