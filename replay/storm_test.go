package replay

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/allocator"
	"github.com/memscale/memscale/device/sim"
)

// stormOutEnv names the Markdown file TestRemapStorm writes its table to
// (bench/results/alloc-budget-remaps.md's measured part); unset, it only
// checks.
const stormOutEnv = "MEMSCALE_STORM_OUT"

// stormSteps is the number of training steps replayed per allocator: step 1
// fills a fresh allocator, steps 2 and later are the steady state.
const stormSteps = 4

// stormConfig is one allocator configuration of the storm replay.
type stormConfig struct {
	name string
	// budget tells the allocator the DTR budget (Config.Budget).
	budget bool
	slack  float64 // Config.BudgetSlack
	// plan calls StepBoundary before each step (step plans).
	plan bool
}

// stormRun is one trace, ratio and configuration: its steps.
type stormRun struct {
	trace  string
	ratio  float64
	budget uint64
	cfg    stormConfig
	steps  []AllocatorStep
}

// steady returns the most remapped granules of a steady-state step, the
// largest share of the granules mapped, and the highest peak reserved over
// the budget.
func (r stormRun) steady() (remaps int64, share, reserved float64) {
	for i, s := range r.steps {
		reserved = max(reserved, float64(s.PeakReserved)/float64(r.budget))
		if i == 0 {
			continue
		}
		remaps = max(remaps, s.Remaps)
		share = max(share, s.RemapShare())
	}
	return remaps, share, reserved
}

// runStorm replays a trace for stormSteps steps through a fresh allocator on
// a simulated card twice the baseline peak, the engine holding the
// allocator's allocated bytes at budget.
func runStorm(t *testing.T, st sweepTrace, ratio float64, cfg stormConfig) stormRun {
	t.Helper()
	budget := Budget(ratio, st.base.Peak)
	gran := uint64(sim.DefaultGranularity)
	dev, err := sim.New(sim.Config{Capacity: (2*st.base.Peak/gran + 8) * gran})
	require.NoError(t, err)
	ac := allocator.Config{Device: dev, BudgetSlack: cfg.slack}
	if cfg.budget {
		ac.Budget = budget
	}
	a, err := allocator.New(ac)
	require.NoError(t, err)
	steps, err := RunAllocatorStepsWith(st.tr, Options{Budget: budget}, a, stormSteps, StepOptions{Boundaries: cfg.plan})
	require.NoError(t, err, "%s at %.0f%%, %s", st.name, 100*ratio, cfg.name)
	require.NoError(t, a.Close())
	require.NoError(t, dev.Close())
	require.Len(t, steps, stormSteps, "%s at %.0f%%, %s: every step finishes", st.name, 100*ratio, cfg.name)
	return stormRun{trace: st.name, ratio: ratio, budget: budget, cfg: cfg, steps: steps}
}

// TestRemapStorm replays the five DTR traces at 50 % and 30 % of their
// baseline peak through a fresh allocator, four steps each, as a DTR
// training run does (issue 29): without the budget the cache is bounded by
// the allocated high-water mark, which the engine holds at the budget, and
// granules are remapped on nearly every miss; told the budget, the cache
// keeps up to budget x 1.1 mapped. Checked: the budget never lets reserved
// memory past budget x (1 + slack) by more than 5 % (free memory in pieces
// that hold no whole granule cannot be unmapped, so growth then creates
// memory up to the limit), the steady steps of ResNet-32 (50 %, 30 %) and the Transformer
// (50 %) remap nothing, and over all the runs the budget remaps at most two
// thirds as many granules as the storm. Told where steps begin as well
// (StepBoundary: step plans), steps 3-4 of every run remap nothing with
// reserved within 1.1 x the budget (step 2 moves memory into the plan's
// layout), and the steps 3-4 of all the runs remap at most a tenth as many
// granules as best fit. With
// MEMSCALE_STORM_OUT set it also sweeps the slack and writes the table:
//
//	MEMSCALE_STORM_OUT=$PWD/storm.md go test ./replay -run TestRemapStorm -count=1
func TestRemapStorm(t *testing.T) {
	traces := loadSweep(t)
	storm := stormConfig{name: "budget not told (storm)", slack: -1}
	told := stormConfig{name: "budget told, slack 0.10 (default)", budget: true}
	planned := stormConfig{name: "budget told, slack 0.10, step boundaries (plan)", budget: true, plan: true}
	configs := []stormConfig{storm, told, planned}
	out := os.Getenv(stormOutEnv)
	if out != "" {
		configs = append(configs,
			stormConfig{name: "budget told, slack 0.20", budget: true, slack: 0.2},
			stormConfig{name: "budget told, slack 0.30", budget: true, slack: 0.3},
			stormConfig{name: "budget told, slack 0.50", budget: true, slack: 0.5},
			stormConfig{name: "budget told, slack 0.20, step boundaries (plan)", budget: true, slack: 0.2, plan: true},
			stormConfig{name: "budget told, slack 0.35, step boundaries (plan)", budget: true, slack: 0.35, plan: true})
	}
	// zero lists the runs whose steady steps must not remap, told the budget;
	// planZero those whose steps 3-4 must not remap with step boundaries
	// (step 2 may move memory into the plan's layout).
	zero := map[string]bool{"resnet32/50%": true, "resnet32/30%": true, "transformer/50%": true}
	planZero := map[string]bool{"resnet32/50%": true, "resnet32/30%": true, "transformer/50%": true, "lstm/50%": true, "lstm/30%": true,
		"tv_densenet121/50%": true, "tv_densenet121/30%": true, "transformer/30%": true, "unet/50%": true, "unet/30%": true}
	var runs []stormRun
	var stormTotal, toldTotal int64
	var toldLate, plannedLate int64 // steps 3-4
	for _, ratio := range []float64{0.5, 0.3} {
		for _, st := range traces {
			name := fmt.Sprintf("%s/%.0f%%", st.name, 100*ratio)
			t.Run(name, func(t *testing.T) {
				for i, cfg := range configs {
					r := runStorm(t, st, ratio, cfg)
					runs = append(runs, r)
					remaps, share, reserved := r.steady()
					t.Logf("%-40s steady remaps/step <= %5d (%6.2f%% of mapped), peak reserved %.3f x budget", cfg.name, remaps, 100*share, reserved)
					var total int64
					for _, s := range r.steps[1:] {
						total += s.Remaps
					}
					if i == 0 {
						stormTotal += total
						continue
					}
					slack := cfg.slack
					if slack == 0 {
						slack = allocator.DefaultBudgetSlack
					}
					require.LessOrEqual(t, reserved, 1+slack+0.05, "%s: reserved within the budget's bound", cfg.name)
					for _, s := range r.steps[2:] {
						switch cfg {
						case told:
							toldLate += s.Remaps
						case planned:
							plannedLate += s.Remaps
						}
					}
					if cfg == told {
						toldTotal += total
						if zero[name] {
							require.Zero(t, remaps, "%s: steady steps remap nothing", cfg.name)
						}
					}
					if cfg == planned && planZero[name] {
						for _, s := range r.steps[2:] {
							require.Zero(t, s.Remaps, "%s: steps 3-4 remap nothing", cfg.name)
							// Step 1 runs best fit, which may pass the bound
							// (U-Net at 30 %: 1.132 x).
							require.LessOrEqual(t, float64(s.PeakReserved)/float64(r.budget), 1.1+1e-3,
								"%s: reserved within budget x 1.1 in steps 3-4", cfg.name)
						}
					}
				}
			})
		}
	}
	t.Logf("steady-state remapped granules, all runs: %d without the budget, %d told it", stormTotal, toldTotal)
	require.Less(t, 3*toldTotal, 2*stormTotal, "the budget spares a third of the remaps at least")
	t.Logf("remapped granules in steps 3-4, all runs: %d told the budget, %d with step boundaries", toldLate, plannedLate)
	require.Less(t, 10*plannedLate, toldLate, "step plans spare nine tenths of the steady remaps at least")
	if out != "" {
		require.NoError(t, os.WriteFile(out, []byte(stormTable(runs)), 0o644))
	}
}

// stormTable formats the runs: per trace, ratio and configuration the
// steady-state remaps (max per step and share of the granules mapped), the
// peak reserved over the budget and the malloc latency.
func stormTable(runs []stormRun) string {
	var b strings.Builder
	b.WriteString("| trace | budget | allocator | remapped granules, steps 2 / 3 / 4 | max share of granules mapped, steps 2-4 | steps 3-4 | peak reserved / budget, steps 1-4 / 3-4 | target met (2-4 / 3-4) | malloc p99 (sim), step 2 / steps 3-4 | granules mapped, map calls per step, step 2 / steps 3-4 (max) |\n")
	b.WriteString("|---|---:|---|---:|---:|---:|---:|---|---:|---:|\n")
	for _, r := range runs {
		_, share, reserved := r.steady()
		var res2, res3 float64 // peak reserved over steps 2-4 and 3-4
		for i, s := range r.steps {
			if i >= 1 {
				res2 = max(res2, float64(s.PeakReserved)/float64(r.budget))
			}
			if i >= 2 {
				res3 = max(res3, float64(s.PeakReserved)/float64(r.budget))
			}
		}
		var late float64
		var p99, p99late, calls, maps, calls2, maps2 int64
		var per []string
		for i, s := range r.steps[1:] {
			per = append(per, fmt.Sprint(s.Remaps))
			if i > 0 {
				late = max(late, s.RemapShare())
				p99late = max(p99late, int64(s.MallocP99))
				calls = max(calls, s.MapCalls)
				maps = max(maps, s.Maps)
			} else {
				p99 = int64(s.MallocP99)
				calls2, maps2 = s.MapCalls, s.Maps
			}
		}
		met := func(sh, reserved float64) string {
			if sh <= 0.01 && reserved <= 1.1+1e-3 {
				return "yes"
			}
			return "no"
		}
		fmt.Fprintf(&b, "| %s | %.0f %% (%.2f GiB) | %s | %s | %.2f %% | %.2f %% | %.3f / %.3f | %s / %s | %.1f / %.1f us | %d, %d / %d, %d |\n",
			r.trace, 100*r.ratio, float64(r.budget)/(1<<30), r.cfg.name, strings.Join(per, " / "), 100*share, 100*late, reserved, res3,
			met(share, res2), met(late, res3), float64(p99)/1e3, float64(p99late)/1e3, maps2, calls2, maps, calls)
	}
	return b.String()
}
