package allocator

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/device"
	"github.com/memscale/memscale/device/sim"
)

func newTestAllocator(t *testing.T, cfg Config) (*Allocator, *fakeDevice) {
	t.Helper()
	d := newFakeDevice(8<<30, 2<<20, !cfg.DisableVMM)
	cfg.Device = d
	a, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	return a, d
}

func TestNewRejectsBadConfig(t *testing.T) {
	d := newFakeDevice(1<<30, 2<<20, true)
	tests := []struct {
		name string
		cfg  Config
		want error
		msg  string
	}{
		{"nil device", Config{}, ErrInvalidArgument, "Config.Device is nil"},
		{"limit above capacity", Config{Device: d, Limit: 2 << 30}, ErrInvalidSize, "exceeds the device capacity"},
		{"negative trace capacity", Config{Device: d, TraceCapacity: -1}, ErrInvalidArgument, "TraceCapacity -1"},
		{"NaN slack", Config{Device: d, CacheSlack: math.NaN()}, ErrInvalidArgument, "CacheSlack"},
		{"bad granularity", Config{Device: newFakeDevice(1<<30, 1000, true)}, ErrInvalidSize, "granularity 1000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			require.ErrorIs(t, err, tc.want)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, a *Allocator) error
		want error
		msg  string
	}{
		{"free of a never allocated pointer", func(t *testing.T, a *Allocator) error {
			return a.Free(0xdead000)
		}, ErrUnknownPointer, "0xdead000"},
		{"free of nil", func(t *testing.T, a *Allocator) error {
			return a.Free(0)
		}, ErrUnknownPointer, "Free(0x0)"},
		{"free of an interior pointer", func(t *testing.T, a *Allocator) error {
			p, err := a.Malloc(4096, 1)
			require.NoError(t, err)
			return a.Free(p + 512)
		}, ErrUnknownPointer, "points 512 bytes into the allocation"},
		{"double free (cached block)", func(t *testing.T, a *Allocator) error {
			p, err := a.Malloc(4096, 1)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			return a.Free(p)
		}, ErrDoubleFree, "already freed"},
		{"double free after coalescing", func(t *testing.T, a *Allocator) error {
			// Fill the quick cache so that the frees below coalesce.
			var fill []device.Ptr
			for i := 0; i < quickCap; i++ {
				p, err := a.Malloc(uint64(1000+i)*512, 2)
				require.NoError(t, err)
				fill = append(fill, p)
			}
			for _, p := range fill {
				require.NoError(t, a.Free(p))
			}
			p, err := a.Malloc(4096, 1)
			require.NoError(t, err)
			q, err := a.Malloc(4096, 1)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			require.NoError(t, a.Free(q)) // q merges into p's free block
			return a.Free(q)
		}, ErrDoubleFree, "already free"},
		{"double free while pending", func(t *testing.T, a *Allocator) error {
			p, err := a.Malloc(4096, 1)
			require.NoError(t, err)
			require.NoError(t, a.RecordStream(p, 2))
			a.dev.(*fakeDevice).SetStreamBusy(2, true)
			require.NoError(t, a.Free(p))
			return a.Free(p)
		}, ErrDoubleFree, "waiting for recorded streams"},
		{"record_stream on an unknown pointer", func(t *testing.T, a *Allocator) error {
			return a.RecordStream(0xbeef000, 2)
		}, ErrUnknownPointer, "not a live allocation"},
		{"record_stream on a freed pointer", func(t *testing.T, a *Allocator) error {
			p, err := a.Malloc(4096, 1)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			return a.RecordStream(p, 2)
		}, ErrUnknownPointer, "not a live allocation"},
		{"size above MaxSize", func(t *testing.T, a *Allocator) error {
			_, err := a.Malloc(MaxSize+1, 1)
			return err
		}, ErrInvalidSize, "exceeds the maximum"},
		{"size MaxUint64", func(t *testing.T, a *Allocator) error {
			_, err := a.Malloc(math.MaxUint64, 1)
			return err
		}, ErrInvalidSize, "exceeds the maximum"},
		{"huge size below MaxSize", func(t *testing.T, a *Allocator) error {
			_, err := a.Malloc(1<<40, 1)
			var oom *OOMError
			require.ErrorAs(t, err, &oom)
			return err
		}, device.ErrOutOfMemory, "tried to allocate 1.00 TiB"},
		{"memory fraction 0", func(t *testing.T, a *Allocator) error {
			return a.SetMemoryFraction(0)
		}, ErrInvalidArgument, "(0, 1]"},
		{"memory fraction above 1", func(t *testing.T, a *Allocator) error {
			return a.SetMemoryFraction(1.5)
		}, ErrInvalidArgument, "(0, 1]"},
		{"memory fraction NaN", func(t *testing.T, a *Allocator) error {
			return a.SetMemoryFraction(math.NaN())
		}, ErrInvalidArgument, "(0, 1]"},
		{"limit above capacity", func(t *testing.T, a *Allocator) error {
			return a.SetLimit(9 << 30)
		}, ErrInvalidSize, "exceeds the device capacity"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, d := newTestAllocator(t, Config{})
			before := a.Stats()
			err := tc.run(t, a)
			require.ErrorIs(t, err, tc.want)
			require.Contains(t, err.Error(), tc.msg)
			require.NoError(t, a.checkInvariants())
			require.Empty(t, d.violations)
			// A failed Free loses nothing: the live count is what the test
			// itself allocated and left live.
			after := a.Stats()
			require.GreaterOrEqual(t, after["allocation.all.current"], before["allocation.all.current"])
		})
	}
}

func TestSizeZero(t *testing.T) {
	a, _ := newTestAllocator(t, Config{})
	p, err := a.Malloc(0, 1)
	require.NoError(t, err)
	q, err := a.Malloc(0, 1)
	require.NoError(t, err)
	require.NotZero(t, p)
	require.NotEqual(t, p, q, "zero-size allocations are distinct")
	n, ok := a.SizeOf(p)
	require.True(t, ok)
	require.Zero(t, n)
	st := a.Stats()
	require.Equal(t, int64(2*MinBlockSize), st["allocated_bytes.all.current"])
	require.Zero(t, st["requested_bytes.all.current"])
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(q))
}

func TestClosed(t *testing.T) {
	a, d := newTestAllocator(t, Config{})
	p, err := a.Malloc(1<<20, 1)
	require.NoError(t, err)
	err = a.Close()
	require.ErrorContains(t, err, "1 allocations (1048576 bytes) were still live")
	require.Zero(t, d.Mapped(), "Close returns everything")
	require.Empty(t, d.ranges, "and the address space")
	require.Empty(t, d.events)
	require.NoError(t, a.Close(), "second Close is a no-op")
	_, err = a.Malloc(1, 1)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, a.Free(p), ErrClosed)
	require.ErrorIs(t, a.RecordStream(p, 2), ErrClosed)
	require.ErrorIs(t, a.EmptyCache(), ErrClosed)
	require.ErrorIs(t, a.SetLimit(0), ErrClosed)
	require.Zero(t, a.Allocated())
}

func TestStatsKeys(t *testing.T) {
	a, _ := newTestAllocator(t, Config{EvictionThreshold: 5 << 30, Limit: 6 << 30})
	st := a.Stats()
	for _, name := range []string{"allocation", "allocated_bytes", "active", "active_bytes", "inactive_split",
		"inactive_split_bytes", "requested_bytes", "segment", "reserved_bytes"} {
		for _, pool := range []string{"all", "small_pool", "large_pool"} {
			for _, f := range []string{"current", "peak", "allocated", "freed"} {
				_, ok := st[name+"."+pool+"."+f]
				assert.True(t, ok, name+"."+pool+"."+f)
			}
		}
	}
	for _, k := range []string{"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
		"num_device_free", "max_split_size", "oversize_allocations.current", "oversize_segments.peak",
		"limit_bytes", "eviction_threshold_bytes", "mapped_bytes", "physical_bytes", "virtual_bytes",
		"num_map", "num_unmap", "num_remap", "expandable_segments"} {
		_, ok := st[k]
		assert.True(t, ok, k)
	}
	require.Equal(t, int64(6<<30), st["limit_bytes"])
	require.Equal(t, int64(5<<30), st["eviction_threshold_bytes"])
	a.SetEvictionThreshold(1 << 30)
	require.Equal(t, uint64(1<<30), a.EvictionThreshold())
	require.Equal(t, int64(1<<30), a.Stats()["eviction_threshold_bytes"])
	require.NoError(t, a.SetMemoryFraction(0.5))
	require.Equal(t, uint64(4<<30), a.Limit())
	require.NoError(t, a.SetLimit(0))
	require.Equal(t, uint64(8<<30), a.Limit())

	// Peaks and their reset.
	p, err := a.Malloc(100<<20, 1)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	st = a.Stats()
	require.Equal(t, int64(100<<20), st["allocated_bytes.all.peak"])
	require.Equal(t, int64(100<<20), st["allocated_bytes.large_pool.allocated"])
	require.Equal(t, int64(100<<20), st["allocated_bytes.large_pool.freed"])
	require.Equal(t, int64(1), st["allocation.all.allocated"])
	a.ResetPeakStats()
	st = a.Stats()
	require.Zero(t, st["allocated_bytes.all.peak"])
	require.Equal(t, st["reserved_bytes.all.current"], st["reserved_bytes.all.peak"])
}

func TestRecordStreamDelaysReuse(t *testing.T) {
	a, d := newTestAllocator(t, Config{})
	p, err := a.Malloc(1<<20, 1)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, 1), "own stream: no-op")
	require.NoError(t, a.RecordStream(p, 2))
	require.NoError(t, a.RecordStream(p, 2), "twice: no-op")
	d.SetStreamBusy(2, true)
	require.NoError(t, a.Free(p))
	st := a.Stats()
	require.Zero(t, st["allocated_bytes.all.current"])
	require.Equal(t, int64(1<<20), st["active_bytes.all.current"], "pending free is still active")
	require.Equal(t, int64(1<<20), st["requested_bytes.all.current"])

	q, err := a.Malloc(1<<20, 1)
	require.NoError(t, err)
	require.NotEqual(t, p, q, "not reused while stream 2 is busy")
	d.SetStreamBusy(2, false)
	r, err := a.Malloc(1<<20, 1)
	require.NoError(t, err)
	require.Equal(t, p, r, "reused once the event completed")
	require.Zero(t, a.Stats()["pending_frees"])

	// The recorded streams do not stick to the block.
	require.NoError(t, a.Free(r))
	r2, err := a.Malloc(1<<20, 1)
	require.NoError(t, err)
	require.Equal(t, p, r2)
	require.NoError(t, a.checkInvariants())
}

func TestReuseIsPerStream(t *testing.T) {
	a, _ := newTestAllocator(t, Config{})
	p, err := a.Malloc(1<<20, 1)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	q, err := a.Malloc(1<<20, 2)
	require.NoError(t, err)
	require.NotEqual(t, p, q, "a block cached on stream 1 is not handed to stream 2")
	r, err := a.Malloc(1<<20, 1)
	require.NoError(t, err)
	require.Equal(t, p, r)
}

// TestRemapAcrossSegments shows that memory freed in one segment backs an
// allocation in another (another stream, the other pool) without EmptyCache.
func TestRemapAcrossSegments(t *testing.T) {
	a, d := newTestAllocator(t, Config{Limit: 1 << 30, CacheSlack: -1})
	// Small pool on stream 1: 600 MiB of 1 MiB blocks, then all freed.
	var small []device.Ptr
	for i := 0; i < 600; i++ {
		p, err := a.Malloc(1<<20, 1)
		require.NoError(t, err)
		small = append(small, p)
	}
	for _, p := range small {
		require.NoError(t, a.Free(p))
	}
	// Large pool on stream 2: 900 MiB. Only ~424 MiB is left under the limit.
	p, err := a.Malloc(900<<20, 2)
	require.NoError(t, err)
	st := a.Stats()
	require.Positive(t, st["num_remap"])
	require.Zero(t, st["num_alloc_retries"], "no OOM path needed: ready granules move directly")
	require.LessOrEqual(t, d.Mapped(), uint64(1<<30))
	require.NoError(t, a.checkInvariants())
	require.NoError(t, a.Free(p))
}

func TestCacheSlackBoundsReserved(t *testing.T) {
	// Alternate two sizes so that freed blocks never fit the next request:
	// with remapping, reserved memory stays near the live peak.
	for _, tc := range []struct {
		slack   float64
		maxOver uint64
	}{{0, 16 << 20}, {-1, math.MaxUint64}} {
		a, _ := newTestAllocator(t, Config{CacheSlack: tc.slack})
		var prev device.Ptr
		for i := 0; i < 50; i++ {
			size := uint64(100+i*7) << 20
			p, err := a.Malloc(size, 1)
			require.NoError(t, err)
			if prev != 0 {
				require.NoError(t, a.Free(prev))
			}
			prev = p
		}
		st := a.Stats()
		over := uint64(st["reserved_bytes.all.peak"] - st["allocated_bytes.all.peak"])
		require.LessOrEqual(t, over, tc.maxOver, "slack %v: reserved peak exceeds allocated peak by %d", tc.slack, over)
		if tc.slack < 0 {
			require.Zero(t, st["num_remap"])
			require.Greater(t, over, uint64(100<<20), "without remapping the cache grows")
		}
	}
}

func TestReclaimer(t *testing.T) {
	a, _ := newTestAllocator(t, Config{Limit: 512 << 20})
	var victims []device.Ptr
	for i := 0; i < 4; i++ {
		p, err := a.Malloc(100<<20, 1)
		require.NoError(t, err)
		victims = append(victims, p)
	}
	var asked []uint64
	a.SetReclaimer(func(need uint64) uint64 {
		asked = append(asked, need)
		if len(victims) == 0 {
			return 0
		}
		p := victims[0]
		victims = victims[1:]
		require.NoError(t, a.Free(p)) // no deadlock: called without the lock
		return 100 << 20
	})
	p, err := a.Malloc(300<<20, 1)
	require.NoError(t, err)
	require.NotEmpty(t, asked)
	require.LessOrEqual(t, len(asked), 3)
	require.NoError(t, a.Free(p))

	// A reclaimer that cannot help: OOM.
	a.SetReclaimer(func(uint64) uint64 { return 0 })
	_, err = a.Malloc(1<<30, 1)
	var oom *OOMError
	require.ErrorAs(t, err, &oom)
	a.SetReclaimer(nil)
	require.NoError(t, a.checkInvariants())
}

// TestOOMErrorSaysWhatTheReclaimerDid checks the reclaimer fields of an
// *OOMError and their text.
func TestOOMErrorSaysWhatTheReclaimerDid(t *testing.T) {
	tests := []struct {
		name string
		// frees is how many 100 MiB blocks the reclaimer frees per call
		// (-1: no reclaimer installed).
		frees int
		calls int
		freed uint64
		text  string
	}{
		{"no reclaimer", -1, 0, 0, "no reclaimer installed (nothing was asked to free memory)"},
		{"a reclaimer that cannot help", 0, 1, 0, "the reclaimer was asked 1 time and freed 0 B (0 bytes)"},
		{"a reclaimer that frees too little", 1, 5, 400 << 20, "the reclaimer was asked 5 times and freed 400.00 MiB (419430400 bytes)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := newTestAllocator(t, Config{Limit: 512 << 20})
			var held []device.Ptr
			for range 4 {
				p, err := a.Malloc(100<<20, 1)
				require.NoError(t, err)
				held = append(held, p)
			}
			if tc.frees >= 0 {
				a.SetReclaimer(func(uint64) uint64 {
					var n uint64
					for range tc.frees {
						if len(held) == 0 {
							break
						}
						require.NoError(t, a.Free(held[0]))
						held = held[1:]
						n += 100 << 20
					}
					return n
				})
			}
			_, err := a.Malloc(600<<20, 1)
			var oom *OOMError
			require.ErrorAs(t, err, &oom)
			assert.Equal(t, tc.frees >= 0, oom.ReclaimerInstalled)
			assert.Equal(t, tc.calls, oom.ReclaimCalls)
			assert.Equal(t, tc.freed, oom.Reclaimed)
			assert.Contains(t, err.Error(), tc.text)
		})
	}
}

func TestFreeNeighborsAndSizeOf(t *testing.T) {
	a, _ := newTestAllocator(t, Config{})
	// Three adjacent small blocks on a fresh stream; free the outer ones
	// through the tree (fill the quick cache first).
	var fill []device.Ptr
	for i := 0; i < quickCap; i++ {
		p, err := a.Malloc(uint64(i+1)*512, 9)
		require.NoError(t, err)
		fill = append(fill, p)
	}
	for _, p := range fill {
		require.NoError(t, a.Free(p))
	}
	x, err := a.Malloc(4096, 1)
	require.NoError(t, err)
	y, err := a.Malloc(8192, 1)
	require.NoError(t, err)
	z, err := a.Malloc(4096, 1)
	require.NoError(t, err)
	require.Equal(t, x+4096, y)
	require.Equal(t, y+8192, z)
	l, r := a.FreeNeighbors(y)
	require.Zero(t, l)
	require.Zero(t, r)
	require.NoError(t, a.Free(x))
	require.NoError(t, a.Free(z))
	l, r = a.FreeNeighbors(y)
	require.Equal(t, uint64(4096), l)
	require.Greater(t, r, uint64(4096), "z merged with the rest of the segment")
	n, ok := a.SizeOf(y)
	require.True(t, ok)
	require.Equal(t, uint64(8192), n)
	_, ok = a.SizeOf(x)
	require.False(t, ok)
	l, r = a.FreeNeighbors(x)
	require.Zero(t, l+r)
}

func TestSnapshot(t *testing.T) {
	a, d := newTestAllocator(t, Config{TraceCapacity: 8})
	p, err := a.Malloc(3000, 1)
	require.NoError(t, err)
	q, err := a.Malloc(30<<20, 1)
	require.NoError(t, err)
	r, err := a.Malloc(5<<20, 1)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(r, 2))
	d.SetStreamBusy(2, true)
	require.NoError(t, a.Free(r))
	_, err = a.Malloc(1<<40, 1)
	require.Error(t, err)

	snap := a.Snapshot()
	raw, err := json.Marshal(snap)
	require.NoError(t, err)
	var generic map[string]any
	require.NoError(t, json.Unmarshal(raw, &generic))
	segs := generic["segments"].([]any)
	require.NotEmpty(t, segs)
	seg0 := segs[0].(map[string]any)
	for _, k := range []string{"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
		"stream", "segment_type", "blocks"} {
		require.Contains(t, seg0, k)
	}
	block0 := seg0["blocks"].([]any)[0].(map[string]any)
	for _, k := range []string{"address", "size", "requested_size", "state"} {
		require.Contains(t, block0, k)
	}
	states := map[string]uint64{}
	var total, allocated uint64
	for _, s := range snap.Segments {
		var sum uint64
		for _, b := range s.Blocks {
			states[b.State] += b.Size
			sum += b.Size
		}
		require.Equal(t, s.TotalSize, sum)
		require.Contains(t, []string{"small", "large"}, s.SegmentType)
		total += s.TotalSize
		allocated += s.AllocatedSize
	}
	st := a.Stats()
	require.Equal(t, uint64(st["reserved_bytes.all.current"]), total, "mapped runs add up to reserved")
	require.Equal(t, uint64(st["allocated_bytes.all.current"]), allocated)
	require.Equal(t, uint64(5<<20), states[StateActivePendingFree])
	require.Equal(t, uint64(3072+30<<20), states[StateActiveAllocated])

	traces := generic["device_traces"].([]any)
	require.Len(t, traces, 1)
	entries := snap.DeviceTraces[0]
	require.Len(t, entries, 8, "ring keeps the last TraceCapacity events")
	var actions []string
	for _, e := range entries {
		actions = append(actions, e.Action)
	}
	require.Equal(t, ActionOOM, actions[len(actions)-1])
	oom := entries[len(entries)-1]
	require.NotNil(t, oom.DeviceFree, "an oom event carries device_free, as torch's viewer reads it")
	devFree, _, err := a.dev.MemInfo()
	require.NoError(t, err)
	require.Equal(t, devFree, *oom.DeviceFree)
	for _, e := range entries[:len(entries)-1] {
		require.Nil(t, e.DeviceFree, "only oom events carry device_free")
	}
	rawEntries := traces[0].([]any)
	require.Contains(t, rawEntries[len(rawEntries)-1].(map[string]any), "device_free")
	require.Contains(t, actions, ActionFreeRequested)
	require.Contains(t, strings.Join(actions, " "), ActionAlloc)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(q))
}

func TestFaultInjection(t *testing.T) {
	for _, tc := range []struct {
		name           string
		failMap, failA int
		vmm            bool
		wantOOM        bool
	}{
		{"map fails", 3, 0, true, false},
		{"create fails", 0, 2, true, false},
		{"alloc fails", 0, 2, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := sim.New(sim.Config{Capacity: 1 << 30})
			require.NoError(t, err)
			defer func() { _ = d.Close() }()
			a, err := New(Config{Device: d, DisableVMM: !tc.vmm})
			require.NoError(t, err)
			p, err := a.Malloc(1<<20, 1)
			require.NoError(t, err)
			require.NoError(t, d.InjectFaults(tc.failMap, tc.failA))
			var got []error
			var ptrs []device.Ptr
			for i := 0; i < 6; i++ {
				q, err := a.Malloc(30<<20, 1)
				if err != nil {
					got = append(got, err)
					continue
				}
				ptrs = append(ptrs, q)
				require.NoError(t, a.checkInvariants())
			}
			require.NoError(t, a.checkInvariants())
			require.Len(t, ptrs, 6-len(got))
			for _, err := range got {
				require.True(t, errors.Is(err, sim.ErrInjected), "error names the injected fault: %v", err)
			}
			for _, q := range append(ptrs, p) {
				require.NoError(t, a.Free(q))
			}
			require.NoError(t, a.EmptyCache())
			require.Zero(t, d.Mapped())
			require.NoError(t, a.Close())
		})
	}
}

func TestFallbackSegments(t *testing.T) {
	a, d := newTestAllocator(t, Config{DisableVMM: true})
	require.False(t, a.ExpandableSegments())
	p, err := a.Malloc(100, 1) // small: a 2 MiB segment
	require.NoError(t, err)
	q, err := a.Malloc(3<<20, 1) // large: a 20 MiB segment
	require.NoError(t, err)
	r, err := a.Malloc(18<<20+1, 1) // >= 10 MiB: its own segment, rounded to 2 MiB
	require.NoError(t, err)
	st := a.Stats()
	require.Equal(t, int64(3), st["segment.all.current"])
	require.Equal(t, int64(2<<20+20<<20+20<<20), st["reserved_bytes.all.current"])
	require.Equal(t, uint64(42<<20), d.Mapped())
	s, err := a.Malloc(11<<20, 1) // fits the 17 MiB left of q's segment
	require.NoError(t, err)
	require.Equal(t, int64(3), a.Stats()["segment.all.current"])
	require.NoError(t, a.Free(s))
	for _, x := range []device.Ptr{p, q, r} {
		require.NoError(t, a.Free(x))
	}
	require.NoError(t, a.EmptyCache())
	require.Zero(t, a.Stats()["segment.all.current"])
	require.Zero(t, d.Mapped())
}

// TestSegmentSiblings forces small address ranges so that one (pool, stream)
// needs several expandable segments, and checks that they fill, are reused,
// and are returned when empty.
func TestSegmentSiblings(t *testing.T) {
	a, d := newTestAllocator(t, Config{})
	a.vaSize = 64 << 20
	var ptrs []device.Ptr
	for i := 0; i < 5; i++ {
		p, err := a.Malloc(40<<20, 1)
		require.NoError(t, err)
		ptrs = append(ptrs, p)
		require.NoError(t, a.checkInvariants())
	}
	p, err := a.Malloc(100<<20, 1) // larger than a default range: a range of its own size
	require.NoError(t, err)
	ptrs = append(ptrs, p)
	st := a.Stats()
	require.Equal(t, int64(6), st["segment.large_pool.current"])
	// Free two, then allocate two of 20 MiB: they fit the freed blocks.
	require.NoError(t, a.Free(ptrs[1]))
	require.NoError(t, a.Free(ptrs[3]))
	n := d.counts()
	for i := 0; i < 2; i++ {
		q, err := a.Malloc(20<<20, 1)
		require.NoError(t, err)
		ptrs = append(ptrs, q)
	}
	require.Equal(t, n, d.counts(), "served from the cache")
	for i, q := range ptrs {
		if i != 1 && i != 3 {
			require.NoError(t, a.Free(q))
		}
	}
	require.Zero(t, a.Allocated())
	require.NoError(t, a.checkInvariants())
	require.NoError(t, a.EmptyCache())
	st = a.Stats()
	require.Zero(t, st["segment.all.current"])
	require.Zero(t, st["virtual_bytes"])
	require.Empty(t, d.ranges)
}

func TestSetLimitReleasesCache(t *testing.T) {
	a, d := newTestAllocator(t, Config{})
	var ptrs []device.Ptr
	for i := 0; i < 10; i++ {
		p, err := a.Malloc(50<<20, device.Stream(1+i%2))
		require.NoError(t, err)
		ptrs = append(ptrs, p)
	}
	keep := ptrs[0]
	for _, p := range ptrs[1:] {
		require.NoError(t, a.Free(p))
	}
	require.Equal(t, uint64(500<<20), d.Mapped())
	require.NoError(t, a.SetLimit(128<<20))
	require.LessOrEqual(t, d.Mapped(), uint64(128<<20), "cached memory above the new limit was released")
	require.GreaterOrEqual(t, d.Mapped(), uint64(50<<20), "live memory stays")
	_, err := a.Malloc(100<<20, 1)
	var oom *OOMError
	require.ErrorAs(t, err, &oom, "50 MiB live + 100 MiB > 128 MiB")
	require.Equal(t, uint64(128<<20), oom.Limit)
	p, err := a.Malloc(70<<20, 2)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(keep))
	require.NoError(t, a.checkInvariants())
}

func TestFreeRequestedReturnsTheRequestedSize(t *testing.T) {
	a, _ := newTestAllocator(t, Config{})
	sizes := []uint64{1, 513, 4096, 1 << 20, 3<<20 + 7, 64 << 20}
	ptrs := make([]device.Ptr, len(sizes))
	for i, n := range sizes {
		p, err := a.Malloc(n, 0)
		require.NoError(t, err)
		ptrs[i] = p
	}
	// Free in an order that makes neighbours coalesce: the size must be read
	// before the block merges away.
	for _, i := range []int{1, 0, 2, 4, 3, 5} {
		got, err := a.FreeRequested(ptrs[i])
		require.NoError(t, err)
		assert.Equal(t, sizes[i], got, "size %d", sizes[i])
	}
	_, err := a.FreeRequested(ptrs[0])
	require.ErrorIs(t, err, ErrDoubleFree)
	_, err = a.FreeRequested(device.Ptr(0x1000))
	require.ErrorIs(t, err, ErrUnknownPointer)
}

// TestWatermark: the highest allocated bytes since ResetWatermark, apart
// from the peak statistics ResetPeakStats resets.
func TestWatermark(t *testing.T) {
	a, _ := newTestAllocator(t, Config{})
	p, err := a.Malloc(4<<20, 1)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	assert.Equal(t, uint64(4<<20), a.Watermark())
	a.ResetWatermark()
	assert.Zero(t, a.Watermark(), "reset to what is allocated now")
	q, err := a.Malloc(2<<20, 1)
	require.NoError(t, err)
	a.ResetPeakStats()
	assert.Equal(t, uint64(2<<20), a.Watermark(), "ResetPeakStats leaves it")
	require.NoError(t, a.Free(q))
	assert.Equal(t, uint64(2<<20), a.Watermark())
}
