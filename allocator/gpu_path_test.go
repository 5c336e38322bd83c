package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/device"
)

// TestAccessOncePerRange: a 1 GiB growth maps 512 granules with one MapRange
// (one access grant), and giving the memory back unmaps it in one call, not
// one per granule (PyTorch's expandable segments set access once per range).
func TestAccessOncePerRange(t *testing.T) {
	tests := []struct {
		name           string
		sizes          []uint64
		wantMapRanges  int
		wantMapHandles int
	}{
		{"one 1 GiB tensor", []uint64{1 << 30}, 1, 512},
		{"two 512 MiB tensors", []uint64{512 << 20, 512 << 20}, 2, 512},
		{"a 3 MiB tensor", []uint64{3 << 20}, 1, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, d := newTestAllocator(t, Config{})
			var ps []device.Ptr
			for _, sz := range tc.sizes {
				p, err := a.Malloc(sz, 0)
				require.NoError(t, err)
				ps = append(ps, p)
			}
			assert.Equal(t, tc.wantMapRanges, d.nMapRange, "MapRange calls")
			assert.Equal(t, tc.wantMapHandles, d.nMap, "handles mapped")
			for _, p := range ps {
				require.NoError(t, a.Free(p))
			}
			require.NoError(t, a.EmptyCache())
			assert.Equal(t, 1, d.nUnmap, "the coalesced free run is unmapped in one call")
			assert.Equal(t, tc.wantMapHandles, d.nRelease, "every handle released")
			assert.Zero(t, d.Mapped())
			require.NoError(t, a.checkInvariants())
			assert.Empty(t, d.violations)
		})
	}
}

// TestNoEventOnAStreamAfterItsCall: memscale records an event on a stream
// only during a call that hands it that stream. Memory freed on another
// stream and needed under pressure is covered by one device synchronization,
// never by a mark recorded later on that stream (the program may have
// destroyed it: on a real driver that is a dangling pointer, not an error).
// EmptyCache synchronizes the device the same way, so a stream destroyed
// after its memory was freed is never touched.
func TestNoEventOnAStreamAfterItsCall(t *testing.T) {
	a, d := newTestAllocator(t, Config{Limit: 64 << 20, CacheSlack: -1})
	// Stream 1 holds memory it keeps; stream 2 frees its memory.
	keep, err := a.Malloc(16<<20, 1)
	require.NoError(t, err)
	p2, err := a.Malloc(32<<20, 2)
	require.NoError(t, err)
	require.NoError(t, a.Free(p2))
	syncs := d.nSync

	// Stream 3 needs more than is left: stream 2's granules are stolen
	// after one device synchronization, with no event on stream 2.
	p3, err := a.Malloc(40<<20, 3)
	require.NoError(t, err)
	assert.Positive(t, a.Stats()["num_remap"])
	assert.Equal(t, syncs+1, d.nSync, "memory freed on another stream: one device synchronization")
	for s := device.Stream(1); s <= 3; s++ {
		assert.Zero(t, d.recorded[s], "no event recorded on stream %d", s)
	}

	// Stream 3 is destroyed after its free: nothing ever records on it.
	require.NoError(t, a.Free(p3))
	d.mu.Lock()
	d.dead[3] = true
	d.mu.Unlock()
	p4, err := a.Malloc(40<<20, 4)
	require.NoError(t, err, "stream 3's memory is usable after a device sync")
	require.NoError(t, a.Free(p4))
	require.NoError(t, a.EmptyCache(), "EmptyCache after a stream was destroyed")
	assert.Zero(t, d.recorded[3], "the destroyed stream was never touched")

	// EmptyCache returned every segment of streams 2..4: they are forgotten.
	a.mu.Lock()
	var known []device.Stream
	for _, st := range a.streamList {
		known = append(known, st.s)
	}
	a.mu.Unlock()
	assert.Equal(t, []device.Stream{1}, known, "only the stream that still holds memory is remembered")
	require.NoError(t, a.Free(keep))
	require.NoError(t, a.checkInvariants())
	assert.Empty(t, d.violations)
}

// TestRecordStreamForeignAndDestroyed: a stream of another device is
// refused by RecordStream with a clear error and the allocation is freed
// normally; a recorded stream destroyed before Free does not leak the block.
func TestRecordStreamForeignAndDestroyed(t *testing.T) {
	a, d := newTestAllocator(t, Config{})
	d.mu.Lock()
	d.foreign[0x9000] = true
	d.mu.Unlock()
	p, err := a.Malloc(1<<20, 1)
	require.NoError(t, err)
	err = a.RecordStream(p, 0x9000)
	require.ErrorContains(t, err, "stream 0x9000")
	require.ErrorContains(t, err, "another device")
	require.ErrorContains(t, err, "the allocation is unchanged")
	require.NoError(t, a.Free(p), "the block is freed, not leaked")
	assert.Zero(t, a.Stats()["pending_frees"])
	q, err := a.Malloc(1<<20, 1)
	require.NoError(t, err)
	assert.Equal(t, p, q, "and reused")

	require.NoError(t, a.RecordStream(q, 7))
	d.mu.Lock()
	d.dead[7] = true
	d.mu.Unlock()
	require.NoError(t, a.Free(q), "stream 7 was destroyed: the device is synchronized instead")
	r, err := a.Malloc(1<<20, 1)
	require.NoError(t, err)
	assert.Equal(t, p, r, "the block came back")
	assert.Zero(t, a.Stats()["allocated_bytes.all.current"]-int64(1<<20))
	require.NoError(t, a.Free(r))
	require.NoError(t, a.checkInvariants())
}
