package autotune

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
	"github.com/memscale/memscale/replay"
	"github.com/stretchr/testify/require"
)

// tunedOutEnv names the file TestWriteTunedSweepTable writes; unset, the
// test is skipped.
const tunedOutEnv = "MEMSCALE_TUNED_SWEEP_OUT"

func milli(x float64) int64 { return int64(math.Round(x * 1000)) }

// TestWriteTunedSweepTable writes bench/results/dtr-sweep-auto.md, the
// auto policy on the DTR authors' traces:
//
//	MEMSCALE_TUNED_SWEEP_OUT=$PWD/bench/results/dtr-sweep-auto.md go test ./autotune -run TestWriteTunedSweepTable -count=1 -timeout 30m
func TestWriteTunedSweepTable(t *testing.T) {
	out := os.Getenv(tunedOutEnv)
	if out == "" {
		t.Skipf("set %s to the output file to write the table", tunedOutEnv)
	}
	ratios := []float64{0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}
	refs := []evict.Heuristic{evict.DTR, evict.DTREq, evict.MSPS, evict.LRU, evict.Size}
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# The auto policy on the DTR authors' traces")
	p("")
	p("Date: 2026-11-21. Machine: 2 CPU cores (%s/%s, %s), no GPU. Counting memory model unless noted;", runtime.GOOS, runtime.GOARCH, runtime.Version())
	p("budget = int(ratio x baseline peak); overhead = engine clock / baseline compute; runs stop at 2x.")
	p("")
	p("Command (from the repository root):")
	p("")
	p("    MEMSCALE_TUNED_SWEEP_OUT=$PWD/bench/results/dtr-sweep-auto.md go test ./autotune -run TestWriteTunedSweepTable -count=1 -timeout 30m")
	p("")
	p("The same numbers come from `memscale replay all-shared --ratios 0.2..0.9/0.1` (auto is its default).")
	p("")
	p("`auto` is memscale's default policy. Training repeats one step, so the engine runs the first step with the")
	p("default heuristic (anc-sqrt) and records the program it is told about; at the end of the step package autotune")
	p("replays the recording at the same budget under 57 candidate configurations (every heuristic, with the")
	p("recomp_time_factor and recomp_memory_factor exponents in {0.5, 1, 2}, and the five reference algorithms")
	p("exactly as the DTR authors' simulator runs them), abandoning each candidate once it is worse than the best so")
	p("far; the steps that follow run the winner. `step 1` is the first step (anc-sqrt); `steps 2+` the tuned steps;")
	p("`best ref` the lowest overhead of the five reference heuristics in simulator mode (the published algorithms,")
	p("bench/results/dtr-sweep.md section 1); `vs best` = steps 2+ minus best ref, unrounded in the count below;")
	p("`alloc` = the tuned configuration with real placement (allocator memory model); `tune` = wall time of the")
	p("tuning pass (2 workers).")
	p("")
	p("| trace | ratio | step 1 | tuned choice | steps 2+ | best ref | vs best | alloc | tune |")
	p("|---|---:|---:|---|---:|---|---:|---:|---:|")
	start := time.Now()
	var tuneWall time.Duration
	total, atOrBelow, strictly := 0, 0, 0
	var worse []string
	for _, tc := range sharedtraces.ForTest(t) {
		tr := readTrace(t, tc.Path)
		base, err := replay.Run(tr, replay.Options{})
		require.NoError(t, err)
		for _, ratio := range ratios {
			budget := replay.Budget(ratio, base.Peak)
			first, err := replay.Run(tr, replay.Options{Budget: budget, Engine: evict.Config{Heuristic: evict.Auto}, Record: true})
			require.NoError(t, err)
			program := first.Recording
			if !first.Feasible() {
				program = tr
			}
			rep, err := Tune(program, Options{Budget: budget})
			require.NoError(t, err)
			tuneWall += rep.Wall
			cfg := rep.Best.Apply(evict.Config{})
			next, err := replay.Run(tr, replay.Options{Budget: budget, Engine: cfg})
			require.NoError(t, err)
			m, err := replay.NewSimAllocatorModel(budget)
			require.NoError(t, err)
			alloc, err := replay.Run(tr, replay.Options{Budget: budget, Engine: cfg, Memory: m})
			require.NoError(t, err)
			require.NoError(t, m.Close())

			var best replay.Result
			bestH, found := evict.Default, false
			for _, h := range refs {
				x, err := replay.Run(tr, replay.Options{Budget: budget, Engine: evict.Config{Heuristic: h, SimulatorCompat: true}})
				require.NoError(t, err)
				if x.Feasible() && (!found || x.Overhead < best.Overhead) {
					best, bestH, found = x, h, true
				}
			}
			bestCell, vs := "none feasible", ""
			if found {
				total++
				bestCell = fmt.Sprintf("%.3f (%s)", best.Overhead, bestH)
				switch {
				case !next.Feasible():
					vs = "infeasible"
					worse = append(worse, fmt.Sprintf("%s %.1f", sharedtraces.Title(tc.Name), ratio))
				case next.Overhead <= best.Overhead:
					atOrBelow++
					if next.Overhead < best.Overhead {
						strictly++
					}
					vs = fmt.Sprintf("%+.3f", float64(milli(next.Overhead)-milli(best.Overhead))/1000)
				default:
					vs = fmt.Sprintf("%+.4f", next.Overhead-best.Overhead)
					worse = append(worse, fmt.Sprintf("%s %.1f (%s)", sharedtraces.Title(tc.Name), ratio, vs))
				}
			} else if next.Feasible() {
				vs = "only memscale feasible"
			}
			choice := rep.Best.String()
			if !rep.Feasible {
				choice = "(none finished)"
			}
			p("| %s | %.1f | %s | %s | %s | %s | %s | %s | %.2f s |", sharedtraces.Title(tc.Name), ratio, first.Short(), choice, next.Short(),
				bestCell, vs, alloc.Short(), rep.Wall.Seconds())
		}
	}
	p("")
	p("Steps 2+ are at or below the best reference heuristic in %d of the %d cells where one is feasible (strictly", atOrBelow, total)
	p("below in %d).", strictly)
	if len(worse) > 0 {
		p("Above it in: %s.", strings.Join(worse, "; "))
	}
	p("Tuning took %.1f s in all (40 cells); the whole table %.0f s.", tuneWall.Seconds(), time.Since(start).Seconds())
	p("")
	p("What the recorded step can and cannot promise: the choice is the best of the candidates on the step that was")
	p("recorded. On these traces the next step is that same step, so the tuned overhead is exactly what the next steps")
	p("get. A model whose steps differ (varying sequence lengths, data-dependent control flow) gets the configuration")
	p("that was best on its first budgeted step; the plugin tunes once per budget (a new budget re-tunes).")
	require.NoError(t, os.WriteFile(out, []byte(b.String()), 0o644))
	t.Logf("wrote %s", out)
}
