package nativemodel

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	kib = uint64(1) << 10
	mib = uint64(1) << 20
)

func TestRoundSize(t *testing.T) {
	div4, err := ParseConf("roundup_power2_divisions:4")
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		cfg  Config
		in   uint64
		want uint64
	}{
		{"zero gets the minimum block", Config{}, 0, 512},
		{"1 byte", Config{}, 1, 512},
		{"exactly 512", Config{}, 512, 512},
		{"513 -> 1024", Config{}, 513, 1024},
		{"1 MiB + 1", Config{}, mib + 1, mib + 512},
		{"div4: 1200 is below 512x4, plain rounding", div4, 1200, 1536},
		{"div4: 5000 -> 5120 (4096 + 1024 steps)", div4, 5000, 5120},
		{"div4: power of two stays", div4, 4 * mib, 4 * mib},
		{"div4: on a step stays", div4, 5 * mib, 5 * mib},
		{"div4: 3 MiB + 1 -> 3.5 MiB", div4, 3*mib + 1, 3*mib + 512*kib},
		{"div4: 1 GiB + 1 -> 1.25 GiB", div4, 1<<30 + 1, 1<<30 + 256*mib},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.cfg.RoundSize(tc.in))
		})
	}
}

func TestAllocationSize(t *testing.T) {
	for _, tc := range []struct{ in, want uint64 }{
		{512, 2 * mib}, {mib, 2 * mib}, {mib + 512, 20 * mib}, {10*mib - 512, 20 * mib},
		{10 * mib, 10 * mib}, {10*mib + 512, 12 * mib}, {100 * mib, 100 * mib},
	} {
		assert.Equal(t, tc.want, AllocationSize(tc.in), "AllocationSize(%d)", tc.in)
	}
}

func TestParseConf(t *testing.T) {
	c, err := ParseConf("max_split_size_mb:128, roundup_power2_divisions:[256:1,512:2,>:4],expandable_segments:True")
	require.NoError(t, err)
	assert.Equal(t, 128*mib, c.MaxSplitSize)
	assert.True(t, c.ExpandableSegments)
	// [256:1,...]: 256 MiB is interval 8; the first entry fills 0..8.
	want := [roundupIntervals]uint64{1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 4, 4, 4, 4, 4}
	assert.Equal(t, want, c.RoundupPower2Divisions)
	assert.Equal(t, uint64(1), c.divisions(100*mib)) // [64,128) MiB: interval 6
	assert.Equal(t, uint64(2), c.divisions(600*mib)) // [512 MiB, 1 GiB): interval 9
	assert.Equal(t, uint64(4), c.divisions(3<<30))   // [2, 4) GiB: interval 11
	assert.Equal(t, uint64(4), c.divisions(100<<40)) // beyond 64 GiB: the last interval
	assert.Equal(t, uint64(1), c.divisions(512))     // below 1 MiB: interval 0
	for _, bad := range []string{
		"max_split_size_mb:20", "max_split_size_mb:x", "roundup_power2_divisions:3",
		"expandable_segments:yes", "garbage_collection_threshold:0.5", "backend:cudaMallocAsync", "nonsense",
		"roundup_power2_divisions:[300:2]",
	} {
		_, err := ParseConf(bad)
		assert.Error(t, err, bad)
	}
	c, err = ParseConf("")
	require.NoError(t, err)
	assert.Equal(t, "", c.String())
}

// step is one operation of a scenario with the state expected after it.
type step struct {
	malloc   uint64 // bytes to allocate (0 = free)
	stream   int32
	free     int // index of the step whose allocation is freed (malloc == 0)
	empty    bool
	oom      bool
	alloc    uint64 // allocated bytes after the step
	reserved uint64 // reserved bytes after the step
	sameAs   int    // >0: the address equals that step's (1-based)
}

func runSteps(t *testing.T, m *Model, steps []step) []uint64 {
	t.Helper()
	addrs := make([]uint64, len(steps))
	for i, s := range steps {
		switch {
		case s.empty:
			m.EmptyCache()
		case s.malloc > 0:
			a, err := m.Malloc(s.malloc, s.stream)
			if s.oom {
				require.Error(t, err, "step %d", i)
				assert.True(t, errors.Is(err, ErrOutOfMemory), "step %d", i)
				continue
			}
			require.NoError(t, err, "step %d", i)
			addrs[i] = a
			if s.sameAs > 0 {
				assert.Equal(t, addrs[s.sameAs-1], a, "step %d address", i)
			}
		default:
			require.NoError(t, m.Free(addrs[s.free]), "step %d", i)
		}
		st := m.Stats()
		assert.Equal(t, s.alloc, st.Allocated, "step %d allocated", i)
		assert.Equal(t, s.reserved, st.Reserved, "step %d reserved", i)
	}
	return addrs
}

func TestScenarios(t *testing.T) {
	for _, tc := range []struct {
		name  string
		conf  string
		cap   uint64
		steps []step
		check func(t *testing.T, m *Model, addrs []uint64)
	}{
		{
			name: "small requests share a 2 MiB segment, split by 512-byte blocks",
			steps: []step{
				{malloc: 1000, alloc: 1024, reserved: 2 * mib},
				{malloc: 1000, alloc: 2048, reserved: 2 * mib},
				{malloc: mib, alloc: 2048 + mib, reserved: 2 * mib},
				{malloc: mib, alloc: 2048 + 2*mib, reserved: 4 * mib},
			},
			check: func(t *testing.T, m *Model, a []uint64) {
				assert.Equal(t, a[0]+1024, a[1])
				assert.Equal(t, a[0]+2048, a[2])
				assert.Equal(t, int64(2), m.Stats().NumDeviceAlloc)
			},
		},
		{
			name: "freed neighbours coalesce and are reused at the lowest fitting address",
			steps: []step{
				{malloc: 1000, alloc: 1024, reserved: 2 * mib},
				{malloc: 1000, alloc: 2048, reserved: 2 * mib},
				{free: 0, alloc: 1024, reserved: 2 * mib},
				{free: 1, alloc: 0, reserved: 2 * mib},
				{malloc: mib, alloc: mib, reserved: 2 * mib, sameAs: 1},
			},
		},
		{
			name: "1-10 MiB requests split a 20 MiB segment; a remainder of 1 MiB or less is not split off",
			steps: []step{
				{malloc: 5 * mib, alloc: 5 * mib, reserved: 20 * mib},
				// 14.5 MiB from the 15 MiB remainder: 0.5 MiB left is not > 1 MiB.
				{malloc: 14*mib + 512*kib, alloc: 20 * mib, reserved: 20 * mib},
				// >= 10 MiB: its own segment, rounded to 2 MiB (12 MiB); the
				// 1 MiB left is not split off, so the block counts 12 MiB.
				{malloc: 11 * mib, alloc: 32 * mib, reserved: 32 * mib},
			},
		},
		{
			name: "max_split_size: oversize blocks serve only requests within 20 MiB, and are not split",
			conf: "max_split_size_mb:100",
			steps: []step{
				{malloc: 200 * mib, alloc: 200 * mib, reserved: 200 * mib},
				{free: 0, alloc: 0, reserved: 200 * mib},
				// A 50 MiB request may not take the 200 MiB oversize block.
				{malloc: 50 * mib, alloc: 50 * mib, reserved: 250 * mib},
				// 190 MiB may: 200 < 190 + 20; the block is not split.
				{malloc: 190 * mib, alloc: 250 * mib, reserved: 250 * mib, sameAs: 1},
				{free: 3, alloc: 50 * mib, reserved: 250 * mib},
				// 170 MiB may not: 200 >= 170 + 20.
				{malloc: 170 * mib, alloc: 220 * mib, reserved: 420 * mib},
			},
		},
		{
			name: "max_split_size: at the capacity the largest oversize blocks are released first",
			conf: "max_split_size_mb:100",
			cap:  300 * mib,
			steps: []step{
				{malloc: 200 * mib, alloc: 200 * mib, reserved: 200 * mib},
				{free: 0, alloc: 0, reserved: 200 * mib},
				{malloc: 50 * mib, alloc: 50 * mib, reserved: 250 * mib},
				// 210 MiB: 250 + 210 > 300; release_available_cached_blocks
				// frees the 200 MiB block (200 < 210, so it reports failure
				// but the block is gone), release_cached_blocks finds nothing
				// else, the retry fits: 50 + 210.
				{malloc: 210 * mib, alloc: 260 * mib, reserved: 260 * mib},
			},
			check: func(t *testing.T, m *Model, _ []uint64) {
				assert.Equal(t, int64(1), m.Stats().NumAllocRetries)
				assert.Equal(t, int64(1), m.Stats().NumDeviceFree)
			},
		},
		{
			name: "a block is reused only on its own stream",
			steps: []step{
				{malloc: 4 * mib, stream: 0, alloc: 4 * mib, reserved: 20 * mib},
				{free: 0, alloc: 0, reserved: 20 * mib},
				{malloc: 4 * mib, stream: 1, alloc: 4 * mib, reserved: 40 * mib},
				{malloc: 4 * mib, stream: 0, alloc: 8 * mib, reserved: 40 * mib, sameAs: 1},
			},
		},
		{
			name: "out of memory: cached segments are released and the request retried, then it fails",
			cap:  40 * mib,
			steps: []step{
				{malloc: 30 * mib, alloc: 30 * mib, reserved: 30 * mib},
				{malloc: 12 * mib, alloc: 30 * mib, reserved: 30 * mib, oom: true},
				{free: 0, alloc: 0, reserved: 30 * mib},
				// On stream 0 the free 30 MiB block would be split; on stream 1
				// 30 + 12 > 40: the free segment is released, the retry fits.
				{malloc: 12 * mib, stream: 1, alloc: 12 * mib, reserved: 12 * mib},
			},
			check: func(t *testing.T, m *Model, _ []uint64) {
				assert.Equal(t, int64(1), m.Stats().NumOOMs)
				assert.Equal(t, int64(2), m.Stats().NumAllocRetries)
			},
		},
		{
			name: "expandable segments: one segment per stream grows by 20 MiB chunks (large pool)",
			conf: "expandable_segments:True",
			steps: []step{
				{malloc: 5 * mib, alloc: 5 * mib, reserved: 20 * mib},
				// 16 MiB does not fit the 15 MiB free block: one more chunk is
				// mapped behind it, the merged 35 MiB block is split.
				{malloc: 16 * mib, alloc: 21 * mib, reserved: 40 * mib},
				{malloc: 1000, alloc: 21*mib + 1024, reserved: 42 * mib},
				{free: 1, alloc: 5*mib + 1024, reserved: 42 * mib},
				{free: 0, alloc: 1024, reserved: 42 * mib},
				{free: 2, alloc: 0, reserved: 42 * mib},
				{empty: true, alloc: 0, reserved: 0},
			},
			check: func(t *testing.T, m *Model, a []uint64) {
				assert.Equal(t, a[0]+5*mib, a[1], "the 16 MiB block follows the 5 MiB one")
				assert.Equal(t, int64(3), m.Stats().ChunksMapped)
				assert.Empty(t, m.segs, "empty_cache returns the empty segments")
			},
		},
		{
			name: "expandable segments split any remainder of 512 bytes or more",
			conf: "expandable_segments:True",
			steps: []step{
				{malloc: 18 * mib, alloc: 18 * mib, reserved: 20 * mib},
				{malloc: 1*mib + 512*kib, alloc: 19*mib + 512*kib, reserved: 20 * mib},
			},
		},
		{
			name: "expandable segments: out of memory unmaps free chunks for another stream",
			conf: "expandable_segments:True",
			cap:  40 * mib,
			steps: []step{
				{malloc: 30 * mib, stream: 0, alloc: 30 * mib, reserved: 40 * mib},
				{free: 0, alloc: 0, reserved: 40 * mib},
				{malloc: 30 * mib, stream: 1, alloc: 30 * mib, reserved: 40 * mib},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConf(tc.conf)
			require.NoError(t, err)
			cfg.Capacity = tc.cap
			m := New(cfg)
			addrs := runSteps(t, m, tc.steps)
			if tc.check != nil {
				tc.check(t, m, addrs)
			}
			checkInvariants(t, m)
		})
	}
}

// checkInvariants walks every segment: blocks tile it, allocated bytes add up,
// free mapped blocks are in the pool, no two free neighbours of the same
// mapping state are left unmerged.
func checkInvariants(t *testing.T, m *Model) {
	t.Helper()
	var alloc uint64
	for _, b := range m.active {
		alloc += b.size
		assert.True(t, b.allocated)
	}
	assert.Equal(t, m.stats.Allocated, alloc)
	for _, p := range []*pool{m.small, m.large} {
		p.blocks.Ascend(func(b *block) bool {
			assert.False(t, b.allocated)
			assert.True(t, b.mapped)
			if b.next != nil {
				assert.Equal(t, b.addr+b.size, b.next.addr)
				assert.False(t, !b.next.allocated && b.next.mapped, "unmerged free neighbours at 0x%x", b.addr)
			}
			return true
		})
	}
}

func TestFreeUnknown(t *testing.T) {
	m := New(Config{})
	assert.Error(t, m.Free(12345))
}
