package allocator

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/device"
)

// TestConcurrent hammers one allocator from 8 goroutines (run it with -race):
// malloc, free, record_stream on several streams, with readers of Stats,
// Snapshot and Allocated, and an occasional EmptyCache. At the end the
// counters must add up.
func TestConcurrent(t *testing.T) {
	for _, vmm := range []bool{true, false} {
		d := newSimTestDevice(t, 4<<30, 0)
		a, err := New(Config{Device: d, DisableVMM: !vmm, TraceCapacity: 128})
		require.NoError(t, err)
		streams := testStreams(t, d, 3)
		const workers, steps = 8, 3000
		var mallocs, ooms atomic.Int64
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(w), 99))
				var live []device.Ptr
				for i := 0; i < steps; i++ {
					switch op := r.IntN(100); {
					case op < 50 || len(live) == 0:
						p, err := a.Malloc(logUniform(r, 64<<20), streams[1+r.IntN(3)])
						if err != nil {
							ooms.Add(1)
							continue
						}
						mallocs.Add(1)
						live = append(live, p)
					case op < 92:
						j := r.IntN(len(live))
						if err := a.Free(live[j]); err != nil {
							t.Error(err)
							return
						}
						live[j] = live[len(live)-1]
						live = live[:len(live)-1]
					case op < 96:
						if err := a.RecordStream(live[r.IntN(len(live))], streams[1+r.IntN(3)]); err != nil {
							t.Error(err)
							return
						}
					case op < 97:
						_ = a.EmptyCache()
					case op < 98:
						_ = a.Snapshot()
					default:
						st := a.Stats()
						if st["allocated_bytes.all.current"] < 0 || a.Allocated() > uint64(4<<30) {
							t.Errorf("bad counters: %d", st["allocated_bytes.all.current"])
						}
					}
				}
				for _, p := range live {
					if err := a.Free(p); err != nil {
						t.Error(err)
					}
				}
			}(w)
		}
		wg.Wait()
		require.NoError(t, a.EmptyCache())
		require.NoError(t, a.checkInvariants())
		st := a.Stats()
		require.Equal(t, mallocs.Load(), st["allocation.all.allocated"])
		require.Equal(t, mallocs.Load(), st["allocation.all.freed"])
		for _, k := range []string{"allocation.all.current", "allocated_bytes.all.current", "active_bytes.all.current",
			"requested_bytes.all.current", "reserved_bytes.all.current", "pending_frees"} {
			require.Zero(t, st[k], k)
		}
		require.Equal(t, st["allocated_bytes.all.allocated"], st["allocated_bytes.all.freed"])
		require.Equal(t, st["num_ooms"], ooms.Load())
		require.Zero(t, d.Mapped())
		require.NoError(t, a.Close())
		t.Logf("vmm=%v: %d mallocs, %d OOMs, %d remaps", vmm, mallocs.Load(), ooms.Load(), st["num_remap"])
	}
}
