package replay

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/sharedtraces"
	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/require"
)

// sweepOutEnv names the file TestWriteSweepTable writes; unset, the test is
// skipped (it replays 5 traces x 8 ratios x 7 configurations, about two
// minutes).
const sweepOutEnv = "MEMSCALE_SWEEP_OUT"

type sweepTrace struct {
	name string
	tr   *rc.Trace
	base Result
}

func loadSweep(t *testing.T) []sweepTrace {
	var out []sweepTrace
	order := []string{"resnet32", "tv_densenet121", "transformer", "lstm", "unet"}
	byName := map[string]sharedtraces.Trace{}
	for _, tc := range sharedtraces.ForTest(t) {
		byName[tc.Name] = tc
	}
	for _, n := range order {
		tc, ok := byName[n]
		require.True(t, ok, "trace %s missing", n)
		tr := loadTrace(t, tc.Path)
		base, err := Run(tr, Options{})
		require.NoError(t, err)
		out = append(out, sweepTrace{name: n, tr: tr, base: base})
	}
	return out
}

// TestWriteSweepTable writes bench/results/dtr-sweep.md:
//
//	MEMSCALE_SWEEP_OUT=$PWD/bench/results/dtr-sweep.md go test ./replay -run TestWriteSweepTable -count=1 -timeout 30m
func TestWriteSweepTable(t *testing.T) {
	out := os.Getenv(sweepOutEnv)
	if out == "" {
		t.Skipf("set %s to the output file to write the sweep table", sweepOutEnv)
	}
	traces := loadSweep(t)
	refHeuristics := []evict.Heuristic{evict.DTR, evict.DTREq, evict.MSPS, evict.LRU, evict.Size}
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }

	p("# DTR budget sweep: memscale engine on the DTR authors' traces")
	p("")
	p("Date: 2026-11-21. Machine: 2 CPU cores (%s/%s, %s), no GPU. Memory model: counting", runtime.GOOS, runtime.GOARCH, runtime.Version())
	p("(bytes, as the DTR authors' simulator simrd counts them) unless noted. Budget = int(ratio x baseline peak);")
	p("overhead = engine clock / baseline compute (simrd's definition); a run stops at 2x (`>2x`);")
	p("`oom` = memory needed and nothing evictable.")
	p("")
	p("Command (from the repository root):")
	p("")
	p("    MEMSCALE_SWEEP_OUT=$PWD/bench/results/dtr-sweep.md go test ./replay -run TestWriteSweepTable -count=1 -timeout 30m")
	p("")
	p("## Baselines (unlimited budget)")
	p("")
	p("| trace | peak bytes | compute ns | instructions |")
	p("|---|---:|---:|---:|")
	for _, st := range traces {
		p("| %s | %d | %d | %d |", sharedtraces.Title(st.name), st.base.Peak, st.base.Compute, st.tr.Len())
	}
	p("")
	p("These equal the simulator's baselines exactly (TestBaselineExact).")
	p("")

	// 1. simulator mode: the reference heuristics
	type key struct {
		trace string
		h     evict.Heuristic
		ratio float64
	}
	ref := map[key]Result{}
	for _, st := range traces {
		for _, h := range refHeuristics {
			for _, r := range sweepRatios {
				res, err := Run(st.tr, Options{Budget: Budget(r, st.base.Peak), Engine: evict.Config{Heuristic: h, SimulatorCompat: true}})
				require.NoError(t, err)
				ref[key{st.name, h, r}] = res
			}
		}
	}
	p("## 1. Reference heuristics, simulator mode")
	p("")
	p("`evict.Config{SimulatorCompat: true}` reproduces simrd's RuntimeV2EagerOptimized (released tensors stay")
	p("recomputable forever, pinned ones stay resident, zero-byte storages are candidates, ties broken by candidate-pool")
	p("order). Every cell of the REFERENCE.md table is reproduced exactly (marked `=`; TestReproducesReferenceTable")
	p("checks them); the other ratios are new.")
	p("")
	header := "| trace | heuristic |"
	sep := "|---|---|"
	for _, r := range sweepRatios {
		header += fmt.Sprintf(" %.1f |", r)
		sep += "---:|"
	}
	p("%s", header)
	p("%s", sep)
	for _, st := range traces {
		for _, h := range refHeuristics {
			row := fmt.Sprintf("| %s | %s |", sharedtraces.Title(st.name), h)
			for _, r := range sweepRatios {
				c := cell(ref[key{st.name, h, r}])
				if want, ok := referenceTable[st.name][r][h]; ok {
					if want == c {
						c += " ="
					} else {
						c += " (ref " + want + ")"
					}
				}
				row += " " + c + " |"
			}
			p("%s", row)
		}
	}
	p("")

	// 2. memscale default
	start := time.Now()
	def := map[key]Result{}
	var searches int64
	var searchTime time.Duration
	for _, st := range traces {
		for _, r := range sweepRatios {
			res, err := Run(st.tr, Options{Budget: Budget(r, st.base.Peak)})
			require.NoError(t, err)
			def[key{st.name, evict.Default, r}] = res
			searches += res.VictimSearches
			searchTime += res.VictimSearchTime
		}
	}
	sweepWall := time.Since(start)
	alloc := map[key]Result{}
	for _, st := range traces {
		for _, r := range sweepRatios {
			m, err := NewSimAllocatorModel(Budget(r, st.base.Peak))
			require.NoError(t, err)
			res, err := Run(st.tr, Options{Budget: Budget(r, st.base.Peak), Memory: m})
			require.NoError(t, err)
			require.NoError(t, m.Close())
			alloc[key{st.name, evict.Default, r}] = res
		}
	}

	p("## 2. memscale's default heuristic: %s", evict.DefaultHeuristic)
	p("")
	p("memscale's default *policy* is `auto`: this heuristic for the first step, then the configuration package")
	p("autotune chooses by replaying the recorded step (bench/results/dtr-sweep-auto.md: at or below the best")
	p("reference heuristic in every cell). This section is the heuristic alone, i.e. the first step.")
	p("")
	p("Score = (c + cost of the evicted-ancestor closure) / (m * sqrt(staleness)): h_MSPS's numerator (what")
	p("recomputing the storage really costs), and the geometric mean of h_MSPS (no staleness) and h_DTR (staleness")
	p("to the first power). Engine mechanisms in default mode: a released storage is dropped at once - unless an")
	p("evicted storage the program still references was computed from it directly, then it stays an ordinary")
	p("candidate until that one is back (evict.Config.DropNeededReleased turns this off) - and banished")
	p("(freed for good) when all its dependents are; storages rebuilt only to recompute something else and no longer")
	p("referenced are evicted before referenced ones. `best ref` is the lowest overhead of the five reference")
	p("heuristics in simulator mode at that ratio (section 1, which heuristic in brackets); `vs best` and `vs e*`")
	p("are the default minus those (as shown, 3 decimals); `alloc` is the default under the allocator memory model (every storage placed by the")
	p("memscale allocator on a simulated card, the budget as its hard limit, rounding and fragmentation included).")
	p("")
	p("| trace | ratio | default | budget evictions | remats | best ref | vs best | vs e* | alloc |")
	p("|---|---:|---:|---:|---:|---|---:|---:|---:|")
	miss, total := 0, 0
	var misses []string
	for _, st := range traces {
		for _, r := range sweepRatios {
			d := def[key{st.name, evict.Default, r}]
			bestH, best := evict.Default, Result{}
			found := false
			for _, h := range refHeuristics {
				x := ref[key{st.name, h, r}]
				if x.Status == OK && (!found || x.Overhead < best.Overhead) {
					best, bestH, found = x, h, true
				}
			}
			bestCell, vs := "none feasible", ""
			if found {
				bestCell = fmt.Sprintf("%.3f (%s)", best.Overhead, bestH)
				total++
				if d.Status != OK {
					vs = "infeasible"
					miss++
					misses = append(misses, fmt.Sprintf("%s %.1f", sharedtraces.Title(st.name), r))
				} else {
					delta := milli(d.Overhead) - milli(best.Overhead)
					vs = fmt.Sprintf("%+.3f", float64(delta)/1000)
					if delta > 0 {
						miss++
						misses = append(misses, fmt.Sprintf("%s %.1f (%s)", sharedtraces.Title(st.name), r, vs))
					}
				}
			} else if d.Status == OK {
				vs = "only default feasible"
			}
			es := ref[key{st.name, evict.DTR, r}]
			vsE := ""
			switch {
			case es.Status == OK && d.Status == OK:
				vsE = fmt.Sprintf("%+.3f", float64(milli(d.Overhead)-milli(es.Overhead))/1000)
			case es.Status != OK && d.Status == OK:
				vsE = "e* " + cell(es)
			}
			p("| %s | %.1f | %s | %d | %d | %s | %s | %s | %s |", sharedtraces.Title(st.name), r, cell(d), d.Evictions,
				d.Rematerializations, bestCell, vs, vsE, cell(alloc[key{st.name, evict.Default, r}]))
		}
	}
	p("")
	p("The default is feasible at U-Net 0.3 and 0.4 (where h_DTR and h_DTR^eq run out of memory). It is at or below")
	p("the best reference heuristic in %d of the %d cells where one is feasible; above it (rounded to 3 decimals) in:", total-miss, total)
	p("%s.", strings.Join(misses, "; "))
	p("")
	p("## Speed")
	p("")
	p("Whole default sweep (5 traces x 8 ratios, counting model, traces parsed once beforehand): %.1f s wall on this", sweepWall.Seconds())
	p("machine, single goroutine. Victim selection inside it: %d selections, %.0f ns mean.", searches, float64(searchTime.Nanoseconds())/float64(max(searches, 1)))
	p("Victim selection with 100,000 candidates: bench/results/dtr-victim-selection.md.")
	require.NoError(t, os.WriteFile(out, []byte(b.String()), 0o644))
	t.Logf("wrote %s", out)
}

// milli rounds an overhead to the thousandths the tables show.
func milli(x float64) int64 { return int64(math.Round(x * 1000)) }

// BenchmarkDefaultSweep replays the five traces at the eight ratios with the
// default engine (traces parsed once, outside the timing).
func BenchmarkDefaultSweep(b *testing.B) {
	var traces []sweepTrace
	for _, tc := range sharedtraces.ForTest(b) {
		tr := loadTrace(b, tc.Path)
		base, err := Run(tr, Options{})
		if err != nil {
			b.Fatal(err)
		}
		traces = append(traces, sweepTrace{name: tc.Name, tr: tr, base: base})
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, st := range traces {
			for _, r := range sweepRatios {
				if _, err := Run(st.tr, Options{Budget: Budget(r, st.base.Peak)}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
}
