package allocator

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/google/btree"
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
//
// Two of its checks are kept incrementally, so that a step costs what the
// allocator's own walk (checkInvariants) costs rather than a sort of every
// block: want, the counters, updated at every change of the live and
// pending sets (expected recomputes them from the sets), and spans, the
// live and pending blocks by address, each checked against its neighbours
// when it joins (clash holds the first failure). A set that stays pairwise
// disjoint under insertions checked against their neighbours is disjoint at
// every step, which is what checkNoOverlap checks with a full sort; runProperty
// still runs both full checks (checkFull) every propConfig.fullEvery steps
// and at the end, and compares them with the incremental state.
type model struct {
	live    map[device.Ptr]*modelAlloc
	order   []device.Ptr       // live pointers, for deterministic picks
	pos     map[device.Ptr]int // index in order
	pending []*modelAlloc
	busy    map[device.Stream]bool
	epoch   map[device.Stream]uint64
	want    [3][5]int64              // what expected returns, kept incrementally
	spans   *btree.BTreeG[modelSpan] // live and pending blocks, by address
	clash   string                   // the first misplaced or overlapping block found by addSpan
}

// modelSpan is a live or pending block's address range.
type modelSpan struct{ lo, hi uint64 }

func newModel() *model {
	return &model{live: map[device.Ptr]*modelAlloc{}, pos: map[device.Ptr]int{}, busy: map[device.Stream]bool{},
		epoch: map[device.Stream]uint64{}, spans: btree.NewG(16, func(a, b modelSpan) bool { return a.lo < b.lo })}
}

// count adds sign times x's share to want: allocation and allocated bytes
// while live, active, active and requested bytes while live or pending
// (expected's definition).
func (m *model) count(x *modelAlloc, live bool, sign int64) {
	for _, p := range []int{0, 1 + int(x.pool)} {
		if live {
			m.want[p][0] += sign
			m.want[p][1] += sign * int64(x.bsize)
		}
		m.want[p][2] += sign
		m.want[p][3] += sign * int64(x.bsize)
		m.want[p][4] += sign * int64(x.req)
	}
}

// addSpan records x's block and checks it as checkNoOverlap does: aligned,
// not nil, disjoint from the blocks already live or pending (its neighbours
// by address suffice: the set is disjoint before it joins).
func (m *model) addSpan(x *modelAlloc) {
	s := modelSpan{uint64(x.p), uint64(x.p) + x.bsize}
	if m.clash != "" {
		return
	}
	if s.lo%MinBlockSize != 0 || s.lo == 0 {
		m.clash = fmt.Sprintf("pointer %#x is nil or not aligned to %d", s.lo, MinBlockSize)
		return
	}
	var below, above modelSpan
	var hasBelow, hasAbove bool
	m.spans.DescendLessOrEqual(s, func(o modelSpan) bool { below, hasBelow = o, true; return false })
	m.spans.AscendGreaterOrEqual(modelSpan{lo: s.lo + 1}, func(o modelSpan) bool { above, hasAbove = o, true; return false })
	switch {
	case hasBelow && below.hi > s.lo:
		m.clash = fmt.Sprintf("blocks [%#x, %#x) and [%#x, %#x) overlap", below.lo, below.hi, s.lo, s.hi)
	case hasAbove && s.hi > above.lo:
		m.clash = fmt.Sprintf("blocks [%#x, %#x) and [%#x, %#x) overlap", s.lo, s.hi, above.lo, above.hi)
	default:
		m.spans.ReplaceOrInsert(s)
	}
}

func (m *model) dropSpan(x *modelAlloc) { m.spans.Delete(modelSpan{lo: uint64(x.p)}) }

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
		} else {
			m.count(x, false, -1)
			m.dropSpan(x)
		}
	}
	clear(m.pending[len(keep):])
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
	m.pos[x.p] = len(m.order)
	m.order = append(m.order, x.p)
	m.count(x, true, 1)
	m.addSpan(x)
}

// remove takes p out of the live set (the last pointer of order takes its
// place) and out of the counters; free puts it back as pending (pend) when
// it waits on recorded streams.
func (m *model) remove(p device.Ptr) *modelAlloc {
	x := m.live[p]
	delete(m.live, p)
	i, last := m.pos[p], m.order[len(m.order)-1]
	m.order[i] = last
	m.pos[last] = i
	m.order = m.order[:len(m.order)-1]
	delete(m.pos, p)
	m.count(x, true, -1)
	return x
}

// pend makes x, just removed, a pending free: active until its events
// complete.
func (m *model) pend(x *modelAlloc) {
	m.pending = append(m.pending, x)
	m.count(x, false, 1)
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
// (0 = all) in the order of modelKeys, recomputed from the live and pending
// sets (want is the same kept incrementally).
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
	// fullEvery: the full recomputations of the model's incremental checks
	// (checkFull) run every fullEvery steps and after the last (0 or 1:
	// every step).
	fullEvery int
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
			m.pend(x)
		} else {
			m.dropSpan(x)
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
		if step == pc.steps-1 || pc.fullEvery <= 1 || step%pc.fullEvery == 0 {
			checkFull(t, m, step, what)
		}
		for p := range m.want {
			for i, v := range m.want[p] {
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
		if m.clash != "" { // checkNoOverlap's verdict, kept incrementally
			t.Fatalf("step %d %s: %s", step, what, m.clash)
		}
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
	m.complete()
	checkFull(t, m, pc.steps, "drain")
	require.Zero(t, m.spans.Len(), "drain: blocks left in the model")
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

// checkFull runs the model's full checks and compares them with its
// incremental state: the counters recomputed from the live and pending sets
// (expected) against want, the blocks sorted and checked pairwise
// (checkNoOverlap) and against spans.
func checkFull(t *testing.T, m *model, step int, what string) {
	t.Helper()
	if want := m.expected(); want != m.want {
		t.Fatalf("step %d %s: model counters kept incrementally %v, recomputed %v", step, what, m.want, want)
	}
	spans := checkNoOverlap(t, m, step, what)
	var kept []modelSpan
	m.spans.Ascend(func(s modelSpan) bool { kept = append(kept, s); return true })
	if !slices.Equal(spans, kept) {
		t.Fatalf("step %d %s: the model's %d blocks by address differ from its %d live and pending blocks", step, what, len(kept), len(spans))
	}
	if len(m.pos) != len(m.order) {
		t.Fatalf("step %d %s: %d positions for %d live blocks", step, what, len(m.pos), len(m.order))
	}
	for i, p := range m.order {
		if m.pos[p] != i {
			t.Fatalf("step %d %s: live block %#x at %d, position %d", step, what, p, i, m.pos[p])
		}
	}
}

// checkNoOverlap verifies that live and pending blocks are 512-byte aligned
// and disjoint, and returns them sorted by address.
func checkNoOverlap(t *testing.T, m *model, step int, what string) []modelSpan {
	t.Helper()
	spans, problem := overlapProblem(m)
	if problem != "" {
		t.Fatalf("step %d %s: %s", step, what, problem)
	}
	return spans
}

// overlapProblem sorts the live and pending blocks by address and says what
// is wrong with them: a nil or misaligned pointer, or two overlapping blocks
// ("" when nothing is).
func overlapProblem(m *model) ([]modelSpan, string) {
	type span = modelSpan
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
			return spans, fmt.Sprintf("pointer %#x is nil or not aligned to %d", s.lo, MinBlockSize)
		}
		if i > 0 && spans[i-1].hi > s.lo {
			return spans, fmt.Sprintf("blocks [%#x, %#x) and [%#x, %#x) overlap", spans[i-1].lo, spans[i-1].hi, s.lo, s.hi)
		}
	}
	return spans, ""
}

// TestModelIncrementalChecks checks the model's incremental checks against
// the full ones over random histories of live, pending and completed blocks,
// many of them misplaced or overlapping: after every operation the counters
// kept (want) equal those recomputed (expected), the blocks kept by address
// equal the live and pending ones, and addSpan has found a problem exactly
// when the full sort finds one (each history ends at its first problem:
// runProperty fails there).
func TestModelIncrementalChecks(t *testing.T) {
	problems, checked, completed := 0, 0, 0
	for seed := uint64(1); seed <= 300; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		m := newModel()
		const s1 = device.Stream(1)
		for step := 0; step < 400; step++ {
			switch op := r.IntN(10); {
			case op < 5 || len(m.order) == 0:
				p := device.Ptr(r.Uint64N(1<<(16+seed%14))) &^ (MinBlockSize - 1) // room for 2^7 to 2^20 blocks
				if r.IntN(2000) == 0 {
					p += device.Ptr(1 + r.Uint64N(MinBlockSize-1))
				}
				if _, dup := m.live[p]; dup {
					continue // the allocator's pointer map holds one block per address
				}
				bs := MinBlockSize * (1 + r.Uint64N(8))
				m.add(&modelAlloc{p: p, req: 1 + r.Uint64N(bs), bsize: bs, pool: poolKind(r.IntN(2))})
			case op < 8:
				x := m.remove(m.order[r.IntN(len(m.order))])
				if r.IntN(2) == 0 {
					x.events = []modelEvent{{stream: s1, busy: m.busy[s1], epoch: m.epoch[s1]}}
					m.pend(x)
				} else {
					m.dropSpan(x)
				}
			case op < 9:
				m.setBusy(s1, !m.busy[s1])
			default:
				n := len(m.pending)
				m.complete()
				completed += n - len(m.pending)
			}
			checked++
			require.Equal(t, m.expected(), m.want, "seed %d step %d", seed, step)
			spans, problem := overlapProblem(m)
			require.Equal(t, problem != "", m.clash != "", "seed %d step %d: full check %q, incremental %q", seed, step, problem, m.clash)
			if problem != "" {
				problems++
				break
			}
			var kept []modelSpan
			m.spans.Ascend(func(s modelSpan) bool { kept = append(kept, s); return true })
			require.True(t, slices.Equal(spans, kept), "seed %d step %d: blocks %v, kept %v", seed, step, spans, kept)
		}
	}
	t.Logf("%d operations checked, %d pending frees completed, %d histories ended by a problem", checked, completed, problems)
	require.Greater(t, problems, 100, "many histories end at a misplaced or overlapping block")
	require.Greater(t, checked, 40000)
	require.Greater(t, completed, 5000)
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
