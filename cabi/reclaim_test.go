package main

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

const mib = int64(1) << 20

// underLimit sets a hard limit of 64 MiB on device 0 for the rest of the
// test, and puts everything back afterwards: no limit, no reclaimer, the
// cache emptied.
func underLimit(t *testing.T) {
	t.Helper()
	require.Zero(t, abiAllocated(0), "a previous test left allocations")
	require.Equal(t, 0, abiSetLimit(0, 64*mib), lastError())
	t.Cleanup(func() {
		assert.Equal(t, 0, abiSetReclaimer(0, nil), lastError())
		assert.Equal(t, 0, abiSetLimit(0, 0), lastError())
		abiEmptyCache()
	})
}

// holdBlocks allocates n blocks of size bytes on device 0 and gives them to r
// (with the tensor ids of tensors, if given); the blocks r did not free are
// freed when the test ends.
func holdBlocks(t *testing.T, r *testReclaimer, n int, size int64, tensors []int64) {
	t.Helper()
	for i := range n {
		p := abiMalloc(size, 0, 0)
		require.NotZero(t, p, lastError())
		tensor := int64(-1)
		if tensors != nil {
			tensor = tensors[i]
		}
		require.True(t, r.hold(p, size, tensor))
	}
	t.Cleanup(func() {
		for p, size := range r.held() {
			abiFree(p, size, 0, 0)
		}
	})
}

func TestReclaimerOnOutOfMemory(t *testing.T) {
	tests := []struct {
		name string
		kind testReclaimerKind
		// install: set the reclaimer; remove: then remove it again.
		install, remove bool
		ok              bool
		calls           int
		// nested: the reclaimer's own malloc failed this many times.
		nested int
		msg    []string
	}{
		{name: "frees an earlier block", kind: reclaimFreeNext, install: true, ok: true, calls: 1},
		{name: "its own malloc does not call it again", kind: reclaimNestedMalloc, install: true, ok: true, calls: 1, nested: 1},
		{name: "cannot help", kind: reclaimZero, install: true, calls: 1,
			msg: []string{"the reclaimer was asked 1 time and freed 0 B (0 bytes)"}},
		{name: "a negative return counts as 0", kind: reclaimNegative, install: true, calls: 1,
			msg: []string{"the reclaimer was asked 1 time and freed 0 B (0 bytes)"}},
		{name: "none installed", kind: reclaimFreeNext, msg: []string{"no reclaimer installed"}},
		{name: "removed", kind: reclaimFreeNext, install: true, remove: true, msg: []string{"no reclaimer installed"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			underLimit(t)
			r := newTestReclaimer(tc.kind, 0)
			t.Cleanup(r.free)
			holdBlocks(t, r, 3, 16*mib, nil)
			if tc.install {
				require.Equal(t, 0, abiSetReclaimer(0, r), lastError())
			}
			if tc.remove {
				require.Equal(t, 0, abiSetReclaimer(0, nil), lastError())
			}
			before := errorCount()
			p := abiMalloc(32*mib, 0, 0)
			assert.Equal(t, tc.calls, r.calls())
			assert.Equal(t, tc.nested, r.nestedFailed())
			if tc.calls > 0 {
				assert.Positive(t, r.lastNeed())
				assert.Equal(t, 0, r.device())
			}
			if tc.ok {
				require.NotZero(t, p, lastError())
				assert.Len(t, r.held(), 2, "one block was freed")
				abiFree(p, 32*mib, 0, 0)
				if tc.nested == 0 {
					assert.Equal(t, before, errorCount())
				}
				return
			}
			require.Zero(t, p)
			assert.Len(t, r.held(), 3, "nothing was freed")
			msg := lastError()
			for _, w := range append([]string{"memscale_malloc: 33554432 bytes on device 0: allocator: out of memory",
				"tried to allocate 32.00 MiB", "allocated 48.00 MiB", "limit 64.00 MiB (67108864 bytes)"}, tc.msg...) {
				assert.Contains(t, msg, w)
			}
			assert.NotContains(t, msg, "DTR engine")
		})
	}
}

// dtrBlocks creates an LRU engine with a pinned 100-byte parameter and n ops
// of size bytes each, allocates a block for each output and gives them to a
// reclaimer that asks the engine for victims.
func dtrBlocks(t *testing.T, n int, size int64) (int64, []int64, *testReclaimer) {
	t.Helper()
	h := newTestEngine(t, `{"heuristic": "lru"}`)
	outs := dtrChain(t, h, n, size)
	r := newTestReclaimer(reclaimEngine, h)
	t.Cleanup(r.free)
	holdBlocks(t, r, n, size, outs)
	return h, outs, r
}

func TestReclaimerAsksTheEngine(t *testing.T) {
	underLimit(t)
	h, outs, r := dtrBlocks(t, 3, 16*mib)
	require.Equal(t, 0, abiSetReclaimer(0, r), lastError())
	p := abiMalloc(32*mib, 0, 0)
	require.NotZero(t, p, lastError())
	defer abiFree(p, 32*mib, 0, 0)
	assert.Equal(t, 1, r.calls())
	held := r.held()
	assert.Len(t, held, 2, "the engine's one victim was freed")
	st := statsOf(t, h)
	assert.Equal(t, float64(16*mib), st["bytes_evicted"])
	assert.Equal(t, float64(1), st["reclaim_victims"])
	_, status := abiDTRStatus(h)
	assert.Equal(t, 16*mib, status.BytesEvicted, "the status block counts the victim")
	// LRU: the oldest output went.
	assert.Equal(t, int32(1), abiDTRPlanCount(h, outs[0]), "outs[0] is evicted: one re-run rebuilds it")
}

func TestReclaimShortfallInTheOOMError(t *testing.T) {
	underLimit(t)
	h, outs, r := dtrBlocks(t, 3, 16*mib)
	for _, id := range outs {
		require.Equal(t, 0, abiDTRLock(h, id), lastError())
	}
	require.Equal(t, 0, abiSetReclaimer(0, r), lastError())
	before := errorCount()
	p := abiMalloc(32*mib, 0, 0)
	require.Zero(t, p)
	assert.Equal(t, before+1, errorCount(), "the shortfall is no error of its own")
	assert.Equal(t, 1, r.calls())
	msg := lastError()
	for _, w := range []string{"out of memory", "the reclaimer was asked 1 time and freed 0 B",
		"; the DTR engine could not free enough: engine " + strconv.FormatInt(h, 10) + ": reclaim of ",
		"bytes found 0: nothing more is evictable", "3 locked (50331648 bytes)", "1 pinned"} {
		assert.Contains(t, msg, w)
	}
	// The shortfall belongs to that malloc: a later failure without a
	// reclaim does not repeat it.
	require.Equal(t, 0, abiSetReclaimer(0, nil), lastError())
	require.Zero(t, abiMalloc(32*mib, 0, 0))
	assert.NotContains(t, lastError(), "DTR engine")
	assert.Contains(t, lastError(), "no reclaimer installed")
}

func TestDTRReclaimArguments(t *testing.T) {
	h := newTestEngine(t, `{"heuristic": "lru"}`)
	outs := dtrChain(t, h, 3, 1000)
	tests := []struct {
		name     string
		h        int64
		need     int64
		capacity int32
		want     int32
		ids      []int64
		err      string
	}{
		{name: "negative need", h: h, need: -1, capacity: 4, want: -1, err: "memscale_dtr_reclaim: need -1: want"},
		{name: "no room", h: h, need: 10, capacity: 0, want: -1, err: "cap 0: want > 0"},
		{name: "unknown handle", h: h + 1000, need: 10, capacity: 4, want: -1, err: "unknown engine handle"},
		{name: "nothing needed", h: h, need: 0, capacity: 4, want: 0},
		{name: "a cap of one: full", h: h, need: 1500, capacity: 1, want: 1, ids: outs[:1]},
		{name: "the open reclaim goes on", h: h, need: 1500, capacity: 1, want: 1, ids: outs[1:2]},
		{name: "and ends", h: h, need: 1500, capacity: 1, want: 0},
		{name: "more than there is", h: h, need: 1 << 40, capacity: 4, want: 1, ids: outs[2:]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := errorCount()
			n, ids := abiDTRReclaim(tc.h, tc.need, tc.capacity)
			assert.Equal(t, tc.want, n)
			assert.Equal(t, tc.ids, ids)
			if tc.err != "" {
				assert.Contains(t, lastError(), tc.err)
				return
			}
			assert.Equal(t, before, errorCount(), "a shortfall is not an error")
		})
	}
	assert.Contains(t, shortfallSince(0), "reclaim of 1099511627776 bytes found 1000: nothing more is evictable")
}

func TestSetReclaimerErrors(t *testing.T) {
	r := newTestReclaimer(reclaimZero, 0)
	t.Cleanup(r.free)
	_, err := allocatorFor(1) // the simulation has one device: opening 1 fails
	require.Error(t, err)
	tests := []struct {
		name string
		dev  int
		r    *testReclaimer
		err  []string
	}{
		{"negative device", -1, r, []string{"memscale_set_reclaimer: device -1", "out of range", "accepted 0 to 63"}},
		{"device too large", maxDevices, nil, []string{"device 64", "out of range"}},
		{"a device that cannot open", 1, r, []string{"device 1 could not be opened", "the simulation has one device"}},
	}
	// Removing is always possible for a device in range.
	before := errorCount()
	assert.Equal(t, 0, abiSetReclaimer(1, nil), lastError())
	assert.Equal(t, before, errorCount())
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := errorCount()
			assert.Equal(t, -1, abiSetReclaimer(tc.dev, tc.r))
			assert.Equal(t, before+1, errorCount())
			for _, w := range tc.err {
				assert.Contains(t, lastError(), w)
			}
		})
	}
}

// TestReclaimerInstalledWhenTheDeviceOpens sets a reclaimer for device 0
// while it has no allocator (the open device is put aside for the test),
// then opens it.
func TestReclaimerInstalledWhenTheDeviceOpens(t *testing.T) {
	require.Zero(t, abiAllocated(0))
	devicesMu.Lock()
	old := devices[0].Swap(nil)
	devicesMu.Unlock()
	t.Cleanup(func() {
		devicesMu.Lock()
		defer devicesMu.Unlock()
		reclaimers[0] = hostReclaimer{}
		if s := devices[0].Swap(old); s != nil && s.alloc != nil {
			assert.NoError(t, s.alloc.Close())
			assert.NoError(t, s.dev.Close())
		}
	})
	r := newTestReclaimer(reclaimFreeNext, 0)
	t.Cleanup(r.free)
	require.Equal(t, 0, abiSetReclaimer(0, r), lastError())
	require.Nil(t, devices[0].Load(), "setting a reclaimer does not open the device")
	require.Equal(t, 0, abiSetLimit(0, 64*mib), lastError()) // opens it
	holdBlocks(t, r, 3, 16*mib, nil)
	p := abiMalloc(32*mib, 0, 0)
	require.NotZero(t, p, lastError())
	assert.Equal(t, 1, r.calls())
	abiFree(p, 32*mib, 0, 0)
}

// observeLogs replaces the process logger with one that records warnings
// for the rest of the test.
func observeLogs(t *testing.T) *observer.ObservedLogs {
	t.Helper()
	core, logs := observer.New(zapcore.WarnLevel)
	p := loadProcess()
	old := p.log
	p.log = zap.New(core)
	t.Cleanup(func() { p.log = old })
	return logs
}

func TestThresholdWarningOnce(t *testing.T) {
	logs := observeLogs(t)
	thresholdWarned.Store(false)
	thresholdWatch.Store(false)
	t.Cleanup(func() {
		assert.Equal(t, 0, abiSetThreshold(0, 0))
		abiEmptyCache()
	})
	const snippet = "eviction needs the memscale Python package"
	steps := []struct {
		name      string
		threshold int64
		engine    bool
		size      int64
		warnings  int // in total so far
		watching  bool
	}{
		{name: "no threshold", size: 8 * mib, warnings: 0},
		{name: "an engine exists", threshold: 4 * mib, engine: true, size: 8 * mib, warnings: 0, watching: true},
		{name: "under the threshold", threshold: 4 * mib, size: 1 * mib, warnings: 0, watching: true},
		{name: "above it without an engine", threshold: 4 * mib, size: 8 * mib, warnings: 1},
		{name: "never again", threshold: 4 * mib, size: 8 * mib, warnings: 1},
		{name: "not even for a new threshold", threshold: 2 * mib, size: 8 * mib, warnings: 1},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			require.Equal(t, 0, abiSetThreshold(0, st.threshold), lastError())
			if st.engine {
				newTestEngine(t, "{}")
			}
			p := abiMalloc(st.size, 0, 0)
			require.NotZero(t, p, lastError())
			abiFree(p, st.size, 0, 0)
			warned := logs.FilterMessageSnippet(snippet)
			require.Equal(t, st.warnings, warned.Len())
			assert.Equal(t, st.watching, thresholdWatch.Load())
			if st.warnings == 0 {
				return
			}
			e := warned.All()[0]
			assert.Equal(t, zapcore.WarnLevel, e.Level)
			assert.Equal(t, thresholdWarning(0, uint64(4*mib), uint64(8*mib)), e.Message)
			for _, w := range []string{"eviction threshold of device 0 is 4194304 bytes", "allocated is 8388608 bytes",
				"`python -m memscale run your_script.py`", "memscale.enable()"} {
				assert.Contains(t, e.Message, w)
			}
			assert.Equal(t, uint64(4*mib), e.ContextMap()["eviction_threshold"])
		})
	}
}
