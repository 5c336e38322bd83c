package allocator

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/device"
)

// propDevice is what the property tests need from a device: the fake, or the
// sim behind a wrapper that counts calls and never blocks.
type propDevice interface {
	device.Device
	SetStreamBusy(s device.Stream, busy bool)
	counts() int
	Mapped() uint64
	problems() []string
}

func (d *fakeDevice) problems() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.violations...)
}

// modelAlloc is a live or pending allocation in the reference model.
type modelAlloc struct {
	p       device.Ptr
	req     uint64
	bsize   uint64
	stream  device.Stream
	pool    poolKind
	streams []device.Stream // recorded streams
	events  []modelEvent    // pending free: one per recorded stream
}

type modelEvent struct {
	stream device.Stream
	busy   bool
	epoch  uint64
}

// model is the reference: what must be live, pending and counted, and the
// streams' busy state with the same event semantics as the devices.
type model struct {
	live    map[device.Ptr]*modelAlloc
	order   []device.Ptr // live pointers, for deterministic picks
	pending []*modelAlloc
	busy    map[device.Stream]bool
	epoch   map[device.Stream]uint64
}

func newModel() *model {
	return &model{live: map[device.Ptr]*modelAlloc{}, busy: map[device.Stream]bool{}, epoch: map[device.Stream]uint64{}}
}

func (m *model) eventDone(e modelEvent) bool {
	return !e.busy || !m.busy[e.stream] || m.epoch[e.stream] != e.epoch
}

// complete drops the pending frees whose events have all completed (what
// the allocator does at the start of Malloc and in EmptyCache).
func (m *model) complete() {
	keep := m.pending[:0]
	for _, x := range m.pending {
		done := true
		for _, e := range x.events {
			done = done && m.eventDone(e)
		}
		if !done {
			keep = append(keep, x)
		}
	}
	m.pending = keep
}

func (m *model) setBusy(s device.Stream, busy bool) {
	if busy && !m.busy[s] {
		m.epoch[s]++
	}
	m.busy[s] = busy
}

func (m *model) add(x *modelAlloc) {
	m.live[x.p] = x
	m.order = append(m.order, x.p)
}

func (m *model) remove(p device.Ptr) *modelAlloc {
	x := m.live[p]
	delete(m.live, p)
	for i, q := range m.order {
		if q == p {
			m.order[i] = m.order[len(m.order)-1]
			m.order = m.order[:len(m.order)-1]
			break
		}
	}
	return x
}

func (m *model) anyBusy() bool {
	for _, b := range m.busy {
		if b {
			return true
		}
	}
	return false
}

// modelKeys are the counters the model predicts, per pool index (0 = all).
var modelKeys = func() (k [3][5]string) {
	for p, pool := range statPoolNames {
		for i, name := range []string{"allocation", "allocated_bytes", "active", "active_bytes", "requested_bytes"} {
			k[p][i] = name + "." + pool + ".current"
		}
	}
	return k
}()

// expected returns the counters the allocator must report, per pool index
// (0 = all) in the order of modelKeys.
func (m *model) expected() (want [3][5]int64) {
	add := func(x *modelAlloc, live bool) {
		for _, p := range []int{0, 1 + int(x.pool)} {
			if live {
				want[p][0]++
				want[p][1] += int64(x.bsize)
			}
			want[p][2]++
			want[p][3] += int64(x.bsize)
			want[p][4] += int64(x.req)
		}
	}
	for _, p := range m.order {
		add(m.live[p], true)
	}
	for _, x := range m.pending {
		add(x, false)
	}
	return want
}

// propConfig describes one property run.
type propConfig struct {
	seed     uint64
	steps    int
	capacity uint64
	maxSize  uint64
	streams  int
	vmm      bool
	slack    float64
	newDev   func() propDevice
	// src, when set, replaces the seeded generator; the run ends early when
	// done reports true.
	src  source
	done func() bool
	// chaos, when set, is run on about one step in 200: budget changes and
	// injected device faults (soak_test.go). It returns what it did.
	chaos func(a *Allocator, d propDevice, r source) string
}

// source is where the property driver takes its decisions from: a seeded
// *rand.Rand, or fuzz bytes.
type source interface {
	IntN(n int) int
	Uint64N(n uint64) uint64
	Float64() float64
}

// logUniform draws a size log-uniformly from [1, max].
func logUniform(r source, max uint64) uint64 {
	v := math.Exp(r.Float64() * math.Log(float64(max)))
	n := uint64(v)
	if n < 1 {
		n = 1
	}
	if n > max {
		n = max
	}
	return n
}

// runProperty drives the allocator and the model with one seeded random
// sequence and checks the invariants after every step.
func runProperty(t *testing.T, pc propConfig) {
	t.Helper()
	if (testing.Short() || raceEnabled) && pc.steps > 500 {
		pc.steps = 500
	}
	d := pc.newDev()
	a, err := New(Config{Device: d, DisableVMM: !pc.vmm, CacheSlack: pc.slack, TraceCapacity: 64})
	require.NoError(t, err)
	defer func() { _ = a.Close() }()
	var r source = rand.New(rand.NewPCG(pc.seed, 0x5eed))
	if pc.src != nil {
		r = pc.src
	}
	m := newModel()
	limit := a.Limit()
	overLimit := false // reserved may exceed a lowered limit until it drains
	var prevPhys uint64
	gran := d.Info().Granularity
	streams := testStreams(t, d, pc.streams)
	stream := func() device.Stream { return streams[1+r.IntN(pc.streams)] }
	var nOOM, nReuse, nMalloc, nInjected int

	malloc := func(size uint64, s device.Stream) (device.Ptr, error) {
		m.complete()
		p, err := a.Malloc(size, s)
		if err != nil {
			return 0, err
		}
		nMalloc++
		bs := a.blockSize(p)
		rs := roundSize(size)
		pk := poolOf(rs)
		require.GreaterOrEqual(t, bs, rs, "block size")
		if pk == smallPool {
			require.Equal(t, rs, bs, "small blocks are exact")
		} else {
			require.LessOrEqual(t, bs, rs+SmallSize, "large blocks keep at most %d extra bytes", SmallSize)
		}
		m.add(&modelAlloc{p: p, req: size, bsize: bs, stream: s, pool: pk})
		return p, nil
	}
	free := func(p device.Ptr) {
		x := m.remove(p)
		require.NoError(t, a.Free(p))
		if len(x.streams) > 0 {
			for _, s := range x.streams {
				x.events = append(x.events, modelEvent{stream: s, busy: m.busy[s], epoch: m.epoch[s]})
			}
			m.pending = append(m.pending, x)
		}
	}
	pick := func() device.Ptr { return m.order[r.IntN(len(m.order))] }

	for step := 0; step < pc.steps; step++ {
		if pc.done != nil && pc.done() {
			break
		}
		op := r.IntN(100)
		what := ""
		switch {
		case op < 50: // malloc
			size := logUniform(r, pc.maxSize)
			s := stream()
			what = fmt.Sprintf("malloc(%d, %d)", size, s)
			_, err := malloc(size, s)
			if err != nil && pc.chaos != nil && isInjected(err) {
				nInjected++
			} else if err != nil {
				var oom *OOMError
				require.ErrorAs(t, err, &oom, what)
				require.ErrorIs(t, err, device.ErrOutOfMemory)
				nOOM++
				if pc.vmm && !m.anyBusy() && len(m.pending) == 0 {
					// With everything idle the allocator must have moved or
					// released every cached granule: the request fails only
					// if the granules live blocks touch plus the request's
					// exceed the limit.
					touched := map[uint64]bool{}
					for _, q := range m.order {
						x := m.live[q]
						for g := uint64(x.p) / gran; g <= (uint64(x.p)+x.bsize-1)/gran; g++ {
							touched[g] = true
						}
					}
					need := uint64(len(touched))*gran + alignUp(roundSize(size), gran)
					require.Greater(t, need, limit, "%s: spurious OOM: %d granules touched by %d live blocks, limit %d: %v",
						what, len(touched), len(m.order), limit, err)
				}
			}
		case op < 80: // free
			if len(m.order) == 0 {
				continue
			}
			p := pick()
			what = fmt.Sprintf("free(%#x)", p)
			free(p)
		case op < 86: // free then malloc the same size on the same stream: reuse
			if len(m.order) == 0 {
				continue
			}
			p := pick()
			x := m.live[p]
			recordedBusy := false
			for _, s := range x.streams {
				recordedBusy = recordedBusy || m.busy[s]
			}
			what = fmt.Sprintf("reuse(%#x, %d, %d)", p, x.req, x.stream)
			free(p)
			before := d.counts()
			_, err := malloc(x.req, x.stream)
			if !recordedBusy {
				require.NoError(t, err, what)
				require.Equal(t, before, d.counts(), "%s: reuse must not map or create memory", what)
				nReuse++
			}
		case op < 92: // record_stream
			if len(m.order) == 0 {
				continue
			}
			p := pick()
			s := stream()
			what = fmt.Sprintf("record_stream(%#x, %d)", p, s)
			require.NoError(t, a.RecordStream(p, s))
			x := m.live[p]
			if s != x.stream && !containsStream(x.streams, s) {
				x.streams = append(x.streams, s)
			}
		case op < 97: // toggle a stream
			s := stream()
			busy := !m.busy[s]
			what = fmt.Sprintf("busy(%d, %v)", s, busy)
			d.SetStreamBusy(s, busy)
			m.setBusy(s, busy)
		case op < 98: // empty cache
			what = "empty_cache"
			m.complete()
			err := a.EmptyCache()
			if err != nil {
				require.ErrorIs(t, err, errWouldBlock)
				require.True(t, m.anyBusy(), "EmptyCache failed with no busy stream: %v", err)
			}
		case op < 99: // change the limit
			newLimit := uint64(0)
			if r.IntN(2) == 0 {
				newLimit = alignUp(pc.capacity/2+r.Uint64N(pc.capacity/2), gran)
			}
			what = fmt.Sprintf("set_limit(%d)", newLimit)
			m.complete()
			require.NoError(t, a.SetLimit(newLimit))
			limit = a.Limit()
		case pc.chaos != nil && r.IntN(2) == 0:
			what = pc.chaos(a, d, r)
		default: // reset peaks
			what = "reset_peak_stats"
			a.ResetPeakStats()
		}

		// Invariants after every step.
		require.NoError(t, a.checkInvariants(), "step %d %s", step, what)
		require.Empty(t, d.problems(), "step %d %s: device saw bad calls", step, what)
		st := a.Stats()
		want := m.expected()
		for p := range want {
			for i, v := range want[p] {
				if k := modelKeys[p][i]; st[k] != v {
					t.Fatalf("step %d %s: %s = %d, model says %d", step, what, k, st[k], v)
				}
			}
		}
		require.Equal(t, uint64(st["allocated_bytes.all.current"]), a.Allocated())
		phys := uint64(st["physical_bytes"])
		require.Equal(t, d.Mapped(), phys, "step %d %s: device memory vs physical_bytes", step, what)
		require.Equal(t, uint64(st["reserved_bytes.all.current"]), phys)
		if phys > limit {
			require.True(t, (overLimit && phys <= prevPhys) || what[:4] == "set_",
				"step %d %s: reserved %d above limit %d (before: %d)", step, what, phys, limit, prevPhys)
			overLimit = true
		} else {
			overLimit = false
		}
		prevPhys = phys
		checkNoOverlap(t, m, step, what)
	}

	// Drain: everything freed, every stream idle, the cache emptied.
	for _, p := range append([]device.Ptr(nil), m.order...) {
		free(p)
	}
	for _, s := range streams[1:] {
		d.SetStreamBusy(s, false)
		m.setBusy(s, false)
	}
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.checkInvariants())
	st := a.Stats()
	for _, k := range []string{"allocated_bytes.all.current", "active_bytes.all.current", "requested_bytes.all.current",
		"reserved_bytes.all.current", "physical_bytes", "pending_frees"} {
		require.Zero(t, st[k], k)
	}
	require.Zero(t, d.Mapped())
	if pc.vmm {
		require.Zero(t, st["segment.all.current"], "empty expandable segments are returned")
	}
	if testing.Verbose() {
		t.Logf("seed %d: %d mallocs, %d OOMs, %d injected faults, %d reuse checks, %d remapped granules, %d device allocs, peak reserved %d MiB",
			pc.seed, nMalloc, nOOM, nInjected, nReuse, st["num_remap"], st["num_device_alloc"], st["reserved_bytes.all.peak"]>>20)
	}
}

func containsStream(ss []device.Stream, s device.Stream) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// checkNoOverlap verifies that live and pending blocks are 512-byte aligned
// and disjoint.
func checkNoOverlap(t *testing.T, m *model, step int, what string) {
	t.Helper()
	type span struct{ lo, hi uint64 }
	spans := make([]span, 0, len(m.order)+len(m.pending))
	for _, p := range m.order {
		x := m.live[p]
		spans = append(spans, span{uint64(x.p), uint64(x.p) + x.bsize})
	}
	for _, x := range m.pending {
		spans = append(spans, span{uint64(x.p), uint64(x.p) + x.bsize})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo < spans[j].lo })
	for i, s := range spans {
		if s.lo%MinBlockSize != 0 || s.lo == 0 {
			t.Fatalf("step %d %s: pointer %#x is nil or not aligned to %d", step, what, s.lo, MinBlockSize)
		}
		if i > 0 && spans[i-1].hi > s.lo {
			t.Fatalf("step %d %s: blocks [%#x, %#x) and [%#x, %#x) overlap", step, what, spans[i-1].lo, spans[i-1].hi, s.lo, s.hi)
		}
	}
}

func TestPropertyFake(t *testing.T) {
	const capacity = 8 << 30
	cases := []struct {
		name    string
		vmm     bool
		gran    uint64
		slack   float64
		maxSize uint64
		seeds   uint64
	}{
		{"vmm", true, 2 << 20, 0, 1 << 30, 4},
		{"vmm-no-remap", true, 2 << 20, -1, 1 << 30, 4},
		{"vmm-slack", true, 2 << 20, 0.25, 1 << 30, 4},
		{"vmm-64KiB-granules", true, 64 << 10, 0, 256 << 20, 2},
		{"fallback", false, 2 << 20, 0, 1 << 30, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for seed := uint64(1); seed <= c.seeds; seed++ {
				runProperty(t, propConfig{
					seed: seed, steps: 3000, capacity: capacity, maxSize: c.maxSize, streams: 3,
					vmm: c.vmm, slack: c.slack,
					newDev: func() propDevice { return newFakeDevice(capacity, c.gran, c.vmm) },
				})
			}
		})
	}
}

// TestOOMMessage checks the numbers an out-of-memory error reports.
func TestOOMMessage(t *testing.T) {
	d := newFakeDevice(1<<30, 2<<20, true)
	a, err := New(Config{Device: d, Limit: 256 << 20})
	require.NoError(t, err)
	p, err := a.Malloc(100<<20, 7)
	require.NoError(t, err)
	_, err = a.Malloc(200<<20, 7)
	var oom *OOMError
	require.ErrorAs(t, err, &oom)
	require.ErrorIs(t, err, device.ErrOutOfMemory)
	require.Equal(t, uint64(200<<20), oom.Requested)
	require.Equal(t, uint64(100<<20), oom.Allocated)
	require.Equal(t, uint64(256<<20), oom.Limit)
	require.Equal(t, int64(1), oom.OOMs)
	require.Equal(t, int64(1), oom.Retries)
	msg := err.Error()
	for _, s := range []string{"tried to allocate 200.00 MiB", "209715200 bytes", "allocated 100.00 MiB", "reserved",
		"limit 256.00 MiB", "num_alloc_retries=1", "num_ooms=1", "stream 0x7"} {
		require.Contains(t, msg, s)
	}
	st := a.Stats()
	require.Equal(t, int64(1), st["num_ooms"])
	require.Equal(t, int64(1), st["num_alloc_retries"])
	require.NoError(t, a.Free(p))
	_, err = a.Malloc(200<<20, 7)
	require.NoError(t, err, "after the free, the same request fits: the granules move")
	require.True(t, errors.Is(oom, device.ErrOutOfMemory))
}
