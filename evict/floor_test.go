package evict

import (
	"errors"
	"fmt"
	"math/rand"
	"testing"

	"github.com/memscale/memscale/internal/bytesize"
	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scanPinned returns the bytes of the resident pinned storages, by the
// definition: a scan of every storage, split by isReg (pinned at
// registration; nil: none is).
func scanPinned(e *Engine, isReg map[rc.StorageID]bool) (reg, later uint64) {
	g := e.Graph()
	for s := rc.StorageID(0); int(s) < g.NumStorages(); s++ {
		if st := g.Storage(s); st.State == rc.Resident && st.Pins > 0 {
			if isReg[s] {
				reg += st.Size
			} else {
				later += st.Size
			}
		}
	}
	return reg, later
}

// scanSmall returns the bytes of the resident unpinned storages under the
// minimum evictee size, by the definition: a scan of every storage.
func scanSmall(e *Engine) uint64 {
	g := e.Graph()
	var n uint64
	for s := rc.StorageID(0); int(s) < g.NumStorages(); s++ {
		if st := g.Storage(s); isSmall(e, st) {
			n += st.Size
		}
	}
	return n
}

func isSmall(e *Engine, st *rc.Storage) bool {
	return st.State == rc.Resident && st.Pins == 0 && st.Size > 0 && st.Size < e.Config().EvicteeMinSize
}

// wantFloor is the floor of an op whose storages of ts are resident
// together, by the definition: every resident pinned or small storage, plus
// the distinct storages of ts that are neither.
func wantFloor(e *Engine, ts ...[]rc.TensorID) uint64 {
	g := e.Graph()
	reg, later := scanPinned(e, nil)
	seen := map[rc.StorageID]bool{}
	n := reg + later + scanSmall(e)
	for _, list := range ts {
		for _, t := range list {
			s := g.Tensor(t).Storage
			if st := g.Storage(s); !seen[s] && (st.State != rc.Resident || st.Pins == 0) && !isSmall(e, st) {
				n += st.Size
			}
			seen[s] = true
		}
	}
	return n
}

func call(t *testing.T, e *Engine, name string, ins []rc.TensorID, outs ...Output) []rc.TensorID {
	t.Helper()
	_, ids, err := e.Call(name, ins, outs, 10, 0)
	require.NoError(t, err)
	return ids
}

func fresh(n uint64) Output { return Output{Size: n, Alias: -1} }

func TestMinBudget(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		// run drives e; the step's minimum budget and the pinned totals
		// (at registration, later) after it are checked.
		run                func(t *testing.T, e *Engine)
		want               MinBudgetParts
		wantReg, wantLater uint64
	}{
		{"no ops", Config{}, func(t *testing.T, e *Engine) {
			e.NewTensor(100, true)
		}, MinBudgetParts{}, 100, 0},
		{"one op", Config{}, func(t *testing.T, e *Engine) {
			call(t, e, "f", []rc.TensorID{e.NewTensor(100, true)}, fresh(200))
		}, MinBudgetParts{100, 0, 0, 200, "f"}, 100, 0},
		{"views and repeated inputs count once", Config{}, func(t *testing.T, e *Engine) {
			y := call(t, e, "f", []rc.TensorID{e.NewTensor(100, true)}, fresh(300))
			call(t, e, "g", []rc.TensorID{y[0], y[0]}, Output{Alias: 1}, fresh(50))
		}, MinBudgetParts{100, 0, 0, 350, "g"}, 100, 0},
		{"unpinned external inputs are op bytes", Config{}, func(t *testing.T, e *Engine) {
			call(t, e, "f", []rc.TensorID{e.NewTensor(500, false)}, fresh(100))
		}, MinBudgetParts{0, 0, 0, 600, "f"}, 0, 0},
		{"gradients are pinned later", Config{}, func(t *testing.T, e *Engine) {
			x := e.NewTensor(100, true)
			a := call(t, e, "f", []rc.TensorID{x}, fresh(200))
			gw := call(t, e, "g", a, fresh(50))
			require.NoError(t, e.Pin(gw[0]))
			call(t, e, "h", a, fresh(10))
		}, MinBudgetParts{100, 50, 0, 210, "h"}, 100, 50},
		{"a registered storage pinned again stays registered", Config{}, func(t *testing.T, e *Engine) {
			x := e.NewTensor(100, true)
			require.NoError(t, e.Pin(x))
			require.NoError(t, e.Unpin(x))
			call(t, e, "f", []rc.TensorID{x}, fresh(1))
		}, MinBudgetParts{100, 0, 0, 1, "f"}, 100, 0},
		{"in-place update of a parameter", Config{}, func(t *testing.T, e *Engine) {
			p := e.NewTensor(100, true)
			gw := e.NewTensor(100, false)
			require.NoError(t, e.Pin(gw))
			_, ids, err := e.Mutate("add_", []rc.TensorID{p, gw}, []int{0}, 10, 0)
			require.NoError(t, err)
			call(t, e, "f", ids, fresh(50))
		}, MinBudgetParts{100, 100, 0, 50, "f"}, 100, 100},
		{"in-place update of an activation", Config{}, func(t *testing.T, e *Engine) {
			a := call(t, e, "f", []rc.TensorID{e.NewTensor(100, true)}, fresh(200))
			_, _, err := e.Mutate("relu_", a, []int{0}, 10, 0)
			require.NoError(t, err)
		}, MinBudgetParts{100, 0, 0, 200, "f"}, 100, 0},
		{"unpinned", Config{}, func(t *testing.T, e *Engine) {
			x := e.NewTensor(100, true)
			require.NoError(t, e.Unpin(x))
			call(t, e, "f", []rc.TensorID{x}, fresh(10))
		}, MinBudgetParts{0, 0, 0, 110, "f"}, 0, 0},
		{"a released pinned storage leaves the totals", Config{}, func(t *testing.T, e *Engine) {
			require.NoError(t, e.Release(e.NewTensor(100, true)))
			call(t, e, "f", []rc.TensorID{e.NewTensor(50, true)}, fresh(10))
		}, MinBudgetParts{50, 0, 0, 10, "f"}, 50, 0},
		{"a re-run after gradients were pinned", Config{Heuristic: LRU}, func(t *testing.T, e *Engine) {
			x := e.NewTensor(100, true)
			a := call(t, e, "f", []rc.TensorID{x}, fresh(200))
			gw := e.NewTensor(300, false)
			require.NoError(t, e.Pin(gw))
			e.SetBudget(400)
			vs := evictAll(t, e, 0)
			require.Len(t, vs, 1)
			require.Equal(t, a[0], vs[0].Tensor)
			steps, err := e.Plan(a[0], nil)
			require.NoError(t, err)
			require.NoError(t, e.HoldPlan(steps))
			require.NoError(t, e.Rematerialized(steps[0].Op, -1))
		}, MinBudgetParts{100, 300, 0, 200, "f"}, 100, 300},
		{"small storages are never evicted: they count while resident", Config{EvicteeMinSize: 64}, func(t *testing.T, e *Engine) {
			x := e.NewTensor(100, true)
			m := call(t, e, "mean", []rc.TensorID{x}, fresh(8)) // small
			small := e.NewTensor(16, false)                     // a small external, released before h
			call(t, e, "g", []rc.TensorID{x}, fresh(40))        // small
			y := call(t, e, "f", []rc.TensorID{x, m[0]}, fresh(300))
			require.NoError(t, e.Release(small))
			call(t, e, "h", y, fresh(500))
		}, MinBudgetParts{100, 0, 48, 800, "h"}, 100, 0},
		{"a small storage pinned counts as pinned, once", Config{EvicteeMinSize: 64}, func(t *testing.T, e *Engine) {
			x := e.NewTensor(100, true)
			m := call(t, e, "mean", []rc.TensorID{x}, fresh(8))
			require.NoError(t, e.Pin(m[0]))
			call(t, e, "f", []rc.TensorID{x, m[0]}, fresh(300))
		}, MinBudgetParts{100, 8, 0, 300, "f"}, 100, 8},
		{"a small storage updated in place counts once", Config{EvicteeMinSize: 64}, func(t *testing.T, e *Engine) {
			x := e.NewTensor(100, true)
			m := call(t, e, "mean", []rc.TensorID{x}, fresh(8))
			_, ids, err := e.Mutate("mul_", []rc.TensorID{m[0], x}, []int{0}, 10, 0)
			require.NoError(t, err)
			call(t, e, "f", []rc.TensorID{x, ids[0]}, fresh(300))
		}, MinBudgetParts{100, 0, 8, 300, "f"}, 100, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, tc.cfg)
			tc.run(t, e)
			assert.Equal(t, tc.want, e.MinBudget())
			reg, later := e.PinnedBytes()
			assert.Equal(t, tc.wantReg, reg, "pinned at registration")
			assert.Equal(t, tc.wantLater, later, "pinned later")
			_, pinned := scanPinned(e, nil)
			assert.Equal(t, pinned, reg+later, "the totals are the resident pinned bytes")
			st := e.Stats()
			assert.Equal(t, tc.want.Bytes(), st.MinBudget)
			assert.Equal(t, tc.want, st.MinBudgetParts)
		})
	}
}

// TestMinBudgetRandomHistories checks the pinned totals against a scan
// after every step, and the minimum budget against its definition after
// every op, re-run and in-place op, over random histories: pins and unpins,
// in-place ops, releases, evictions and swaps under random budgets (none,
// stress) and rebuilds. With stress, it checks after every Evict that no
// candidate that was never rebuilt is left.
func TestMinBudgetRandomHistories(t *testing.T) {
	for seed := int64(1); seed <= 60; seed++ {
		rng := rand.New(rand.NewSource(seed))
		cfg := Config{Heuristic: Heuristic(rng.Intn(int(numHeuristics)))}
		if cfg.Heuristic == Auto {
			cfg.Heuristic = Default
		}
		switch seed % 4 {
		case 1:
			cfg.SwapBandwidth = 1e6
		case 2:
			cfg.Stress = true
		}
		if seed%3 == 0 {
			cfg.EvicteeMinSize = 100 // about a third of the storages are small
		}
		e := newEngine(t, cfg)
		g := e.Graph()
		var live []rc.TensorID
		var most uint64
		// isReg is the model of which pins date from registration: set
		// by NewTensor, cleared by a Pin of an unpinned storage, handed
		// on by an in-place op to the new version.
		isReg := map[rc.StorageID]bool{}
		resident := func() []rc.TensorID {
			var out []rc.TensorID
			for _, x := range live {
				if g.IsResident(x) {
					out = append(out, x)
				}
			}
			return out
		}
		pick := func(ts []rc.TensorID) rc.TensorID { return ts[rng.Intn(len(ts))] }
		for i := 0; i < 300; i++ {
			what := fmt.Sprintf("seed %d step %d", seed, i)
			res := resident()
			switch op := rng.Intn(10); {
			case op == 0 || len(res) == 0:
				pinned := rng.Intn(2) == 0
				x := e.NewTensor(uint64(rng.Intn(300)), pinned)
				isReg[g.Tensor(x).Storage] = pinned
				live = append(live, x)
			case op <= 3:
				ins := []rc.TensorID{pick(res), pick(res)}
				outs := []Output{fresh(uint64(rng.Intn(300)))}
				if rng.Intn(3) == 0 {
					outs = append(outs, Output{Alias: int32(rng.Intn(2))})
				}
				_, ids, err := e.Call("f", ins, outs, int64(1+rng.Intn(100)), 0)
				require.NoError(t, err, what)
				most = max(most, wantFloor(e, ins, ids))
				live = append(live, ids...)
			case op == 4:
				ins := []rc.TensorID{pick(res), pick(res)}
				w := wantFloor(e, ins)
				old := g.StorageOf(ins[0])
				reg := old.Pins > 0 && isReg[g.Tensor(ins[0]).Storage]
				_, ids, err := e.Mutate("f_", ins, []int{0}, int64(1+rng.Intn(100)), 0)
				require.NoError(t, err, what)
				isReg[g.Tensor(ids[0]).Storage] = reg
				most = max(most, w)
				for j, x := range live {
					if x == ins[0] {
						live[j] = ids[0]
						break
					}
				}
			case op == 5:
				x := pick(res)
				if rng.Intn(2) == 0 {
					if g.StorageOf(x).Pins == 0 {
						isReg[g.Tensor(x).Storage] = false
					}
					require.NoError(t, e.Pin(x), what)
				} else if g.StorageOf(x).Pins > 0 {
					require.NoError(t, e.Unpin(x), what)
				}
			case op == 6 && len(live) > 2:
				j := rng.Intn(len(live))
				require.NoError(t, e.Release(live[j]), what)
				live = append(live[:j], live[j+1:]...)
			case op <= 8:
				e.SetBudget(uint64(rng.Intn(int(e.Usage()) + 1)))
				var buf [4]Victim
				for {
					extra := uint64(rng.Intn(100))
					n, err := e.Evict(extra, buf[:])
					if err != nil {
						require.True(t, errors.Is(err, ErrNoEvictable), "%s: %v", what, err)
						if len(e.plans) == 0 {
							// a request that found no room is a bound: the
							// pinned, small and locked storages and extra
							reg, later := scanPinned(e, isReg)
							most = max(most, reg+later+scanSmall(e)+e.lockedBytes()+extra)
						}
						break
					}
					if n < len(buf) {
						break
					}
				}
				for s := rc.StorageID(0); cfg.Stress && int(s) < g.NumStorages(); s++ {
					require.False(t, e.eligible(g.Storage(s)) && !e.flag(s, flagRebuilt),
						"%s: stress left storage %d, a candidate never rebuilt", what, s)
				}
			default:
				// rebuild an evicted or swapped live tensor
				var gone []rc.TensorID
				for _, x := range live {
					if !g.IsResident(x) {
						gone = append(gone, x)
					}
				}
				if len(gone) == 0 {
					break
				}
				steps, err := e.Plan(pick(gone), nil)
				if err != nil {
					break // lost for good (not recomputable)
				}
				require.NoError(t, e.HoldPlan(steps), what)
				for _, st := range steps {
					if st.Kind == rc.StepSwapIn {
						require.NoError(t, e.SwappedIn(st.Tensor), what)
						continue
					}
					o := g.Op(st.Op)
					w := wantFloor(e, o.Inputs, o.Outputs)
					require.NoError(t, e.Rematerialized(st.Op, -1), what)
					most = max(most, w)
				}
			}
			reg, later := e.PinnedBytes()
			wantReg, wantLater := scanPinned(e, isReg)
			require.Equal(t, wantReg, reg, "%s: pinned at registration", what)
			require.Equal(t, wantLater, later, "%s: pinned later", what)
			require.Equal(t, scanSmall(e), e.small, "%s: small storages", what)
			require.Equal(t, most, e.MinBudget().Bytes(), "%s: minimum budget", what)
		}
	}
}

// TestNoteFloorAllocatesNothing: the per-op work of the minimum budget
// allocates nothing.
func TestNoteFloorAllocatesNothing(t *testing.T) {
	e := newEngine(t, Config{})
	x := e.NewTensor(100, true)
	ys := call(t, e, "f", []rc.TensorID{x}, fresh(10), fresh(20))
	ins := []rc.TensorID{x, ys[0]}
	allocs := testing.AllocsPerRun(100, func() { e.noteFloor("g", ins, ys) })
	assert.Zero(t, allocs)
}

func TestBudgetBelowWhatTheStepNeeds(t *testing.T) {
	const mb = 1 << 20
	tests := []struct {
		name   string
		budget uint64
		extra  uint64
		// prefix is the start of the error after "evict: " ("" when the
		// budget is not below what the step needs at this point).
		prefix string
		rest   string
	}{
		{"below", 41 * mb, 10 * mb,
			"budget 41.0 MiB is below what this step needs at this point: 20.0 MiB pinned at registration (parameters, inputs) + " +
				"5.0 MiB pinned later (gradients) + 10.0 MiB under the minimum evictee size (never evicted) + " +
				"30.0 MiB locked by the running op + 10.0 MiB requested; " +
				"the step's minimum budget so far is 75.0 MiB (largest op: native_batch_norm_backward); ",
			"usage 68157440 + 10485760 requested > budget 42991616: nothing evictable"},
		{"below, this point needs more than any op so far", 41 * mb, 40 * mb,
			"budget 41.0 MiB is below what this step needs at this point: 20.0 MiB pinned at registration (parameters, inputs) + " +
				"5.0 MiB pinned later (gradients) + 10.0 MiB under the minimum evictee size (never evicted) + " +
				"30.0 MiB locked by the running op + 40.0 MiB requested; " +
				"the step's minimum budget so far is 105.0 MiB (this point); ",
			"usage 68157440 + 41943040 requested > budget 42991616: nothing evictable"},
		{"too large", 41 * mb, 50 * mb,
			"budget 41.0 MiB is below what this step needs at this point: 20.0 MiB pinned at registration (parameters, inputs) + " +
				"5.0 MiB pinned later (gradients) + 10.0 MiB under the minimum evictee size (never evicted) + " +
				"30.0 MiB locked by the running op + 50.0 MiB requested; " +
				"the step's minimum budget so far is 115.0 MiB (this point); ",
			"an allocation of 52428800 bytes is larger than the whole budget of 42991616 bytes"},
		{"below because of the small storages", 60 * mb, 1 * mb,
			"budget 60.0 MiB is below what this step needs at this point: 20.0 MiB pinned at registration (parameters, inputs) + " +
				"5.0 MiB pinned later (gradients) + 10.0 MiB under the minimum evictee size (never evicted) + " +
				"30.0 MiB locked by the running op + 1.0 MiB requested; " +
				"the step's minimum budget so far is 75.0 MiB (largest op: native_batch_norm_backward); ",
			"usage 68157440 + 1048576 requested > budget 62914560: nothing evictable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, Config{EvicteeMinSize: 5 * mb})
			x := e.NewTensor(20*mb, true)
			a := call(t, e, "conv", []rc.TensorID{x}, fresh(30*mb))
			gw := call(t, e, "native_batch_norm_backward", a, fresh(5*mb), fresh(20*mb))
			require.NoError(t, e.Pin(gw[0]))
			require.NoError(t, e.Release(gw[1]))
			require.Len(t, evictAll(t, e, 0), 1, "the released gradient is handed out")
			call(t, e, "small", a, fresh(4*mb), fresh(3*mb), fresh(3*mb))
			require.Equal(t, MinBudgetParts{20 * mb, 0, 0, 55 * mb, "native_batch_norm_backward"}, e.MinBudget())
			require.NoError(t, e.Lock(a[0]))
			e.SetBudget(tc.budget)
			var buf [4]Victim
			n, err := e.Evict(tc.extra, buf[:])
			require.Zero(t, n)
			require.ErrorIs(t, err, ErrNoEvictable)
			msg := err.Error()
			require.Equal(t, "evict: "+tc.prefix, msg[:min(len(msg), len("evict: "+tc.prefix))], "the floor comes first")
			assert.Contains(t, msg[len("evict: "+tc.prefix):], tc.rest, "the details follow")
			// one source of truth: the minimum budget the engine reports
			// (Stats, the summaries) is the one the error names
			assert.Contains(t, msg, fmt.Sprintf("so far is %s (", bytesize.Format(e.Stats().MinBudget, 1)))
		})
	}
}

// TestFailedRequestSetsTheMinimumBudget: a request that finds no room and
// is a bound (no open plan) becomes the step's minimum budget, so a failed
// step reports what its error names; a second error names it again.
func TestFailedRequestSetsTheMinimumBudget(t *testing.T) {
	e := newEngine(t, Config{Budget: 250})
	x := e.NewTensor(100, true)
	a := call(t, e, "f", []rc.TensorID{x}, fresh(100))
	require.Equal(t, uint64(200), e.MinBudget().Bytes())
	require.NoError(t, e.Lock(a[0]))
	var buf [4]Victim
	_, err := e.Evict(120, buf[:])
	require.ErrorIs(t, err, ErrNoEvictable)
	assert.Contains(t, err.Error(), "the step's minimum budget so far is 320 B (this point)")
	assert.Equal(t, MinBudgetParts{PinnedAtRegistration: 100, OpBytes: 220, Op: pointOp}, e.MinBudget())
	assert.Equal(t, uint64(320), e.Stats().MinBudget)
	_, err = e.Evict(110, buf[:])
	require.ErrorIs(t, err, ErrNoEvictable)
	assert.Contains(t, err.Error(), "the step's minimum budget so far is 320 B (an earlier point that found no room)")
	_, err = e.Evict(300, buf[:])
	var tl *TooLargeError
	require.ErrorAs(t, err, &tl)
	assert.Equal(t, uint64(500), e.Stats().MinBudget, "a request larger than the budget is a bound too")
}

func TestBelowWithNestedPlansKeepsTheLowerBound(t *testing.T) {
	const mb = 1 << 20
	most := MinBudgetParts{PinnedAtRegistration: 20 * mb, PinnedLater: 5 * mb, OpBytes: 30 * mb, Op: "convolution_backward"}
	tests := []struct {
		name string
		f    floorNow
		want string
	}{
		{"plans hold more than the bound: the bound stays the largest op's",
			floorNow{reg: 20 * mb, later: 5 * mb, locked: 40 * mb, extra: 10 * mb, most: most, plans: 3},
			"budget 60.0 MiB is below what this point of the step holds: 20.0 MiB pinned at registration (parameters, inputs) + " +
				"5.0 MiB pinned later (gradients) + 40.0 MiB locked (the running op's inputs and those held for 3 unfinished " +
				"rematerialization plans, which nest at this budget) + 10.0 MiB requested = 75.0 MiB; " +
				"the step's minimum budget (a lower bound) so far is 55.0 MiB (largest op: convolution_backward); "},
		{"no plan: this point is a bound",
			floorNow{reg: 20 * mb, later: 5 * mb, locked: 40 * mb, extra: 10 * mb, most: most},
			"budget 60.0 MiB is below what this step needs at this point: 20.0 MiB pinned at registration (parameters, inputs) + " +
				"5.0 MiB pinned later (gradients) + 40.0 MiB locked by the running op + 10.0 MiB requested; " +
				"the step's minimum budget so far is 75.0 MiB (this point); "},
		{"plans, but within the bound", floorNow{reg: 20 * mb, later: 5 * mb, locked: 20 * mb, extra: 10 * mb, most: most, plans: 1},
			"budget 50.0 MiB is below what this step needs at this point: 20.0 MiB pinned at registration (parameters, inputs) + " +
				"5.0 MiB pinned later (gradients) + 20.0 MiB locked by the running op + 10.0 MiB requested; " +
				"the step's minimum budget so far is 55.0 MiB (largest op: convolution_backward); "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			budget := uint64(60 * mb)
			if tc.f.bytes() < budget {
				budget = 50 * mb
			}
			assert.Equal(t, tc.want, tc.f.below(budget))
		})
	}
}
