package allocator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/device"
	"github.com/memscale/memscale/device/sim"
	"github.com/memscale/memscale/internal/soak"
)

// isInjected reports whether err is a fault device/sim injected.
func isInjected(err error) bool { return errors.Is(err, sim.ErrInjected) }

// soakChaos is the soak's extra step of runProperty: a new DTR budget or
// budget slack, or, on device/sim, faults injected into one of the next few
// Map and allocation calls.
func soakChaos(capacity uint64) func(a *Allocator, d propDevice, r source) string {
	return func(a *Allocator, d propDevice, r source) string {
		switch r.IntN(3) {
		case 0:
			b := uint64(0)
			if r.IntN(4) != 0 {
				b = r.Uint64N(capacity)
			}
			a.SetBudget(b)
			return fmt.Sprintf("set_budget(%d)", b)
		case 1:
			f := []float64{-1, 0, 0.05, 0.5}[r.IntN(4)]
			if err := a.SetBudgetSlack(f); err != nil {
				panic(err)
			}
			return fmt.Sprintf("set_budget_slack(%v)", f)
		}
		sd, ok := d.(*simTestDevice)
		if !ok {
			return "no faults on this device"
		}
		m, c := 1+r.IntN(6), 1+r.IntN(6)
		if err := sd.InjectFaults(m, c); err != nil {
			panic(err)
		}
		return fmt.Sprintf("inject_faults(map %d, alloc %d)", m, c)
	}
}

// TestSoakAllocator is the allocator's part of the soak (issue 32): the
// model-checked property run (runProperty: every counter against the
// reference model, no overlap, invariants and device memory after every
// step) on the fake device and on device/sim, with and without expandable
// segments, three streams, limit changes, empty_cache, budget and slack
// changes and (on the sim) injected Map and allocation faults, over seeds
// until the operations of soak.Ops are done (a few seconds by default;
// MEMSCALE_SOAK_OPS for make soak). Deterministic: the seeds and the steps
// depend on the count only.
func TestSoakAllocator(t *testing.T) {
	total, err := soak.Ops(30000, 0.1)
	require.NoError(t, err)
	const capacity = 8 << 30
	// fullEvery: in the long mode the model's full recomputations (checkFull:
	// counters from the live and pending sets, every block sorted and checked
	// pairwise) run every 256 steps and at the end of each run, its
	// incremental checks at every step; the short slice runs both at every
	// step.
	steps, fullEvery := 3000, 1
	if soak.Long() {
		steps, fullEvery = 20000, 256
	}
	type cfg struct {
		name string
		vmm  bool
		sim  bool
	}
	cfgs := []cfg{{"fake-vmm", true, false}, {"sim-vmm", true, true}, {"fake-fallback", false, false}, {"sim-fallback", false, true}}
	var done int64
	runs := 0
	for seed := uint64(1000); done < total; seed++ {
		c := cfgs[int(seed)%len(cfgs)]
		n := steps
		if testing.Short() || raceEnabled {
			n = min(n, 500) // runProperty's own cap
		}
		n = int(min(int64(n), total-done))
		newDev := func() propDevice { return newFakeDevice(capacity, 2<<20, c.vmm) }
		if c.sim {
			newDev = func() propDevice { return newSimTestDevice(t, capacity, 0) }
		}
		ok := t.Run(fmt.Sprintf("%s/seed%d", c.name, seed), func(t *testing.T) {
			runProperty(t, propConfig{
				seed: seed, steps: n, capacity: capacity, maxSize: 1 << 30, streams: 3, vmm: c.vmm,
				slack: []float64{0, -1, 0.25}[seed%3], newDev: newDev, chaos: soakChaos(capacity),
				fullEvery: fullEvery,
			})
		})
		if !ok {
			t.Fatalf("seed %d (%s) failed after %d operations", seed, c.name, done)
		}
		done += int64(n)
		runs++
	}
	t.Logf("%d model-checked operations in %d runs", done, runs)
}

// TestSoakConcurrent is the threaded part of the soak: workers share one
// allocator on device/sim and malloc, write a tag into both ends of each
// block, record streams and free (checking the tags: a block handed out
// twice, or overlapping another, is overwritten), while a chaos worker
// changes the limit, the budget and its slack, empties the cache and injects
// faults. After every round, with the workers stopped, the allocator's
// counters must equal the sum of the blocks the workers hold, and its
// invariants must hold. Each worker's choices depend on its seed only.
func TestSoakConcurrent(t *testing.T) {
	total, err := soak.Ops(40000, 0.5)
	require.NoError(t, err)
	const capacity = 2 << 30
	const workers, perRound = 6, 1000
	for _, vmm := range []bool{true, false} {
		d := newSimTestDevice(t, capacity, 0)
		a, err := New(Config{Device: d, DisableVMM: !vmm})
		require.NoError(t, err)
		streams := testStreams(t, d, 3)
		type block struct {
			p   device.Ptr
			n   uint64
			tag uint64
		}
		live := make([][]block, workers)
		var ops, injected, ooms atomic.Int64
		write := func(b block) {
			if b.n < 16 {
				return
			}
			binary.LittleEndian.PutUint64(bytesAt(b.p, 8), b.tag)
			binary.LittleEndian.PutUint64(bytesAt(b.p+device.Ptr(b.n-8), 8), ^b.tag)
		}
		check := func(b block) error {
			if b.n < 16 {
				return nil
			}
			if got := binary.LittleEndian.Uint64(bytesAt(b.p, 8)); got != b.tag {
				return fmt.Errorf("block %#x (%d bytes): head tag %#x, want %#x", b.p, b.n, got, b.tag)
			}
			if got := binary.LittleEndian.Uint64(bytesAt(b.p+device.Ptr(b.n-8), 8)); got != ^b.tag {
				return fmt.Errorf("block %#x (%d bytes): tail tag %#x, want %#x", b.p, b.n, got, ^b.tag)
			}
			return nil
		}
		rounds := 0
		for done := int64(0); done < total; rounds++ {
			var wg sync.WaitGroup
			errs := make([]error, workers+1)
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(w), uint64(rounds)))
					for i := 0; i < perRound; i++ {
						ops.Add(1)
						switch op := r.IntN(100); {
						case op < 50 || len(live[w]) == 0:
							n := logUniform(r, 64<<20)
							p, err := a.Malloc(n, streams[r.IntN(4)])
							if err != nil {
								var oom *OOMError
								switch {
								case isInjected(err):
									injected.Add(1)
								case errors.As(err, &oom):
									ooms.Add(1)
								default:
									errs[w] = fmt.Errorf("malloc(%d): %w", n, err)
									return
								}
								continue
							}
							b := block{p: p, n: n, tag: uint64(w)<<56 | uint64(rounds)<<32 | uint64(i)}
							write(b)
							live[w] = append(live[w], b)
						case op < 92:
							j := r.IntN(len(live[w]))
							b := live[w][j]
							if err := check(b); err != nil {
								errs[w] = err
								return
							}
							if err := a.Free(b.p); err != nil {
								errs[w] = fmt.Errorf("free(%#x): %w", b.p, err)
								return
							}
							live[w][j] = live[w][len(live[w])-1]
							live[w] = live[w][:len(live[w])-1]
						default:
							b := live[w][r.IntN(len(live[w]))]
							if err := a.RecordStream(b.p, streams[1+r.IntN(3)]); err != nil {
								errs[w] = fmt.Errorf("record_stream(%#x): %w", b.p, err)
								return
							}
						}
					}
				}(w)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(99, uint64(rounds)))
				for i := 0; i < perRound/20; i++ {
					ops.Add(1)
					var err error
					switch r.IntN(6) {
					case 0:
						err = a.SetLimit([]uint64{0, capacity / 2, capacity * 3 / 4}[r.IntN(3)])
					case 1:
						a.SetBudget([]uint64{0, capacity / 4, capacity / 2}[r.IntN(3)])
					case 2:
						err = a.SetBudgetSlack([]float64{-1, 0, 0.5}[r.IntN(3)])
					case 3:
						err = a.EmptyCache()
					case 4:
						err = d.InjectFaults(1+r.IntN(20), 1+r.IntN(20))
					default:
						_ = a.Stats()
					}
					if err != nil {
						errs[workers] = fmt.Errorf("chaos: %w", err)
						return
					}
				}
			}()
			wg.Wait()
			require.NoError(t, errors.Join(errs...), "round %d", rounds)
			// quiescent: the counters are the workers' blocks
			var want uint64
			for w := range live {
				for _, b := range live[w] {
					want += a.blockSize(b.p)
				}
			}
			require.Equal(t, want, a.Allocated(), "round %d: allocated bytes", rounds)
			require.NoError(t, a.checkInvariants(), "round %d", rounds)
			done = ops.Load()
		}
		for w := range live {
			for _, b := range live[w] {
				require.NoError(t, check(b))
				require.NoError(t, a.Free(b.p))
			}
		}
		require.NoError(t, d.InjectFaults(0, 0))
		require.NoError(t, a.EmptyCache())
		require.NoError(t, a.checkInvariants())
		require.Zero(t, a.Allocated())
		require.Zero(t, d.Mapped())
		require.NoError(t, a.Close())
		t.Logf("vmm %v: %d operations in %d rounds, %d injected faults, %d OOMs", vmm, ops.Load(), rounds, injected.Load(), ooms.Load())
	}
}
