package main

/*
#include <stdlib.h>
#include "memscale_internal.h"

// A reclaimer for the tests, with its state in C memory (ctx). The kinds:
//   0 frees the next block it holds and returns its size (0 when none is left);
//   1 returns 0; 2 returns -5;
//   3 first allocates 1 TiB itself (which must fail without calling it
//     again), then does what kind 0 does;
//   4 asks engine for victims with memscale_dtr_reclaim and frees the blocks
//     of those tensors (tensors[i] is the tensor of ptrs[i]).
enum { TEST_RECLAIM_SLOTS = 16 };
typedef struct {
	int kind;
	int calls;
	int device;
	int nested_failed;
	int64_t last_need;
	int64_t engine;
	int n;
	uintptr_t ptrs[TEST_RECLAIM_SLOTS];
	int64_t sizes[TEST_RECLAIM_SLOTS];
	int64_t tensors[TEST_RECLAIM_SLOTS];
} test_reclaim_state;

static int64_t test_reclaim_free_slot(test_reclaim_state* st, int i) {
	int64_t size = st->sizes[i];
	memscale_free((void*)st->ptrs[i], size, st->device, NULL);
	st->ptrs[i] = 0;
	return size;
}

static int64_t test_reclaimer(int device, int64_t need, void* ctx) {
	test_reclaim_state* st = (test_reclaim_state*)ctx;
	st->calls++;
	st->device = device;
	st->last_need = need;
	switch (st->kind) {
	case 1:
		return 0;
	case 2:
		return -5;
	case 3:
		if (memscale_malloc((ssize_t)1 << 40, device, NULL) == NULL) {
			st->nested_failed++;
		}
		break;
	case 4: {
		int64_t ids[4];
		int32_t acts[4];
		int64_t freed = 0;
		int32_t got;
		do {
			got = memscale_dtr_reclaim(st->engine, need, ids, acts, 4);
			for (int32_t k = 0; k < got; k++) {
				for (int i = 0; i < st->n; i++) {
					if (st->ptrs[i] != 0 && st->tensors[i] == ids[k]) {
						freed += test_reclaim_free_slot(st, i);
					}
				}
			}
		} while (got == 4);
		return freed;
	}
	}
	for (int i = 0; i < st->n; i++) {
		if (st->ptrs[i] != 0) {
			return test_reclaim_free_slot(st, i);
		}
	}
	return 0;
}

static uintptr_t test_reclaimer_fn(void) { return (uintptr_t)test_reclaimer; }
*/
import "C"

import (
	"unsafe"

	"github.com/memscale/memscale/evict"
)

// clearError is memscale_clear_error, for tests (test files cannot use cgo).
// It clears the calling thread's last error and the process's (lastError).
func clearError() {
	C.memscale_clear_error()
	empty := ""
	lastRecorded.Store(&empty)
}

// goStringAndFree copies a C string returned by cString and frees it, for
// tests.
func goStringAndFree(s *C.char) string {
	defer C.free(unsafe.Pointer(s))
	return C.GoString(s)
}

// mallocFreePair runs one memscale_malloc/memscale_free pair through the Go
// exports on device 0, for tests; it reports whether both succeeded.
func mallocFreePair(size int64) bool {
	before := errorCount()
	p := memscale_go_malloc(C.int64_t(size), 0, 0)
	if p == 0 {
		return false
	}
	memscale_go_free(p, C.int64_t(size), 0, 0)
	return errorCount() == before
}

// The wrappers below call the Go exports with Go types, for the tests and
// the ABI fuzz target (test files cannot use cgo). C memory is used for every
// array, as from C.

// abiMalloc calls memscale_malloc's Go export.
func abiMalloc(size int64, dev int, stream uintptr) uintptr {
	return uintptr(memscale_go_malloc(C.int64_t(size), C.int(dev), C.uintptr_t(stream)))
}

// abiFree calls memscale_free's Go export.
func abiFree(p uintptr, size int64, dev int, stream uintptr) {
	memscale_go_free(C.uintptr_t(p), C.int64_t(size), C.int(dev), C.uintptr_t(stream))
}

// abiSimStreamCreate calls memscale_sim_stream_create's Go export; -1 on error.
func abiSimStreamCreate(dev int) (uintptr, int) {
	var s C.uintptr_t
	rc := memscale_go_sim_stream_create(C.int(dev), &s)
	return uintptr(s), int(rc)
}

// abiSimStreamDestroy calls memscale_sim_stream_destroy's Go export.
func abiSimStreamDestroy(dev int, s uintptr) int {
	return int(memscale_go_sim_stream_destroy(C.int(dev), C.uintptr_t(s)))
}

// abiRecordStream calls memscale_record_stream's Go export.
func abiRecordStream(p, stream uintptr) {
	memscale_go_record_stream(C.uintptr_t(p), C.uintptr_t(stream))
}

// abiEmptyCache calls memscale_empty_cache's Go export.
func abiEmptyCache() { memscale_go_empty_cache() }

// abiAllocated calls memscale_allocated's Go export.
func abiAllocated(dev int) int64 { return int64(memscale_go_allocated(C.int(dev))) }

// publishedDevices is MEMSCALE_PUBLISHED_DEVICES.
func publishedDevices() int { return C.MEMSCALE_PUBLISHED_DEVICES }

// publishedAllocated reads memscale_allocated_address(dev) as C code would.
func publishedAllocated(dev int) int64 { return int64(*C.memscale_allocated_address(C.int(dev))) }

// publishedAddressNil reports whether memscale_allocated_address(dev) is NULL.
func publishedAddressNil(dev int) bool { return C.memscale_allocated_address(C.int(dev)) == nil }

// abiDTRCreate calls memscale_dtr_create's Go export.
func abiDTRCreate(config string) int64 {
	cs := C.CString(config)
	defer C.free(unsafe.Pointer(cs))
	return int64(memscale_go_dtr_create(cs))
}

// abiDTRDestroy calls memscale_dtr_destroy's Go export.
func abiDTRDestroy(h int64) int { return int(memscale_go_dtr_destroy(C.int64_t(h))) }

// abiDTRTensor calls memscale_dtr_tensor's Go export.
func abiDTRTensor(h, nbytes int64, pinned int32) int64 {
	return int64(memscale_go_dtr_tensor(C.int64_t(h), C.int64_t(nbytes), C.int32_t(pinned)))
}

// abiDTRCall calls memscale_dtr_call's Go export with one output per entry of
// sizes and alias; it returns the op id and the output ids.
func abiDTRCall(h int64, inputs []int64, sizes []int64, alias []int32, cost int64, flags int32) (int64, []int64) {
	in := cInt64s(inputs)
	defer C.free(unsafe.Pointer(in))
	sz := cInt64s(sizes)
	defer C.free(unsafe.Pointer(sz))
	al := (*C.int32_t)(C.calloc(C.size_t(len(alias)+1), 4))
	defer C.free(unsafe.Pointer(al))
	for i, a := range alias {
		unsafe.Slice(al, len(alias))[i] = C.int32_t(a)
	}
	out := (*C.int64_t)(C.calloc(C.size_t(len(sizes)+1), 8))
	defer C.free(unsafe.Pointer(out))
	name := C.CString("fuzz_op")
	defer C.free(unsafe.Pointer(name))
	op := int64(memscale_go_dtr_call(C.int64_t(h), name, in, C.int32_t(len(inputs)), sz, al, C.int32_t(len(sizes)),
		C.int64_t(cost), C.int32_t(flags), out))
	ids := make([]int64, len(sizes))
	for i, v := range unsafe.Slice(out, len(sizes)) {
		ids[i] = int64(v)
	}
	return op, ids
}

// dtrOpFrame is a C frame for memscale_dtr_op with room for 64 entries.
type dtrOpFrame struct{ p *C.int64_t }

func newDTROpFrame() dtrOpFrame { return dtrOpFrame{(*C.int64_t)(C.calloc(64, 8))} }

func (f dtrOpFrame) free() { C.free(unsafe.Pointer(f.p)) }

// abiDTROp calls memscale_dtr_op's Go export through frame f (inputs < 0:
// releases only); it returns the op id (or -1), the output ids and the
// handed-out (storage-root id, action) pairs.
func abiDTROp(f dtrOpFrame, h int64, released, inputs, sizes, alias []int64, cost, flags, capacity int64) (int64, []int64, [][2]int64) {
	v := unsafe.Slice(f.p, 64)
	nIn := int64(len(inputs))
	if inputs == nil {
		nIn = -1
	}
	head := []int64{int64(len(released)), nIn, int64(len(sizes)), cost, flags, capacity}
	i := 0
	for _, part := range [][]int64{head, released, inputs, sizes, alias} {
		for _, x := range part {
			v[i] = C.int64_t(x)
			i++
		}
	}
	name := C.CString("fuzz_op")
	defer C.free(unsafe.Pointer(name))
	op := int64(memscale_go_dtr_op(C.int64_t(h), name, f.p))
	if op < 0 || nIn < 0 {
		return op, nil, nil
	}
	ids := make([]int64, len(sizes))
	for j := range ids {
		ids[j] = int64(v[j])
	}
	var freed [][2]int64
	for j := range int(v[len(sizes)]) {
		freed = append(freed, [2]int64{int64(v[len(sizes)+1+2*j]), int64(v[len(sizes)+2+2*j])})
	}
	return op, ids, freed
}

// abiDTROpNoFrame calls memscale_dtr_op's Go export with NULL name and frame.
func abiDTROpNoFrame(h int64) int64 { return int64(memscale_go_dtr_op(C.int64_t(h), nil, nil)) }

// dtrChainStep registers op "chain" of one 1000-byte output reading x
// through memscale_dtr_op and frame f, allocating nothing of its own; it
// returns the output's id (or -1).
func dtrChainStep(f dtrOpFrame, name dtrOpFrame, h, x int64) int64 {
	v := unsafe.Slice(f.p, 10)
	v[0], v[1], v[2], v[3], v[4], v[5] = 0, 1, 1, 10, 0, 8
	v[6], v[7], v[8] = C.int64_t(x), 1000, -1
	if memscale_go_dtr_op(C.int64_t(h), (*C.char)(unsafe.Pointer(name.p)), f.p) < 0 {
		return -1
	}
	return int64(v[0])
}

// abiDTRRelease calls memscale_dtr_release's Go export.
func abiDTRRelease(h, t int64) int { return int(memscale_go_dtr_release(C.int64_t(h), C.int64_t(t))) }

// abiDTRLock calls memscale_dtr_lock's Go export.
func abiDTRLock(h, t int64) int { return int(memscale_go_dtr_lock(C.int64_t(h), C.int64_t(t))) }

// abiDTRPin calls memscale_dtr_pin's Go export.
func abiDTRPin(h, t int64) int { return int(memscale_go_dtr_pin(C.int64_t(h), C.int64_t(t))) }

// abiDTRUnlock calls memscale_dtr_unlock's Go export.
func abiDTRUnlock(h, t int64) int { return int(memscale_go_dtr_unlock(C.int64_t(h), C.int64_t(t))) }

// abiDTREvict calls memscale_dtr_evict's Go export with extra and room for
// capacity victims; it returns the count (or -1) and the victim ids.
func abiDTREvict(h, extra int64, capacity int32) (int32, []int64) {
	return abiVictims(capacity, func(ids *C.int64_t, acts *C.int32_t) C.int32_t {
		return memscale_go_dtr_evict(C.int64_t(h), C.int64_t(extra), ids, acts, C.int32_t(capacity))
	})
}

// abiVictims runs call (memscale_dtr_evict or memscale_dtr_reclaim) with C
// arrays of room for capacity victims; it returns the count (or -1) and the
// victim ids.
func abiVictims(capacity int32, call func(ids *C.int64_t, acts *C.int32_t) C.int32_t) (int32, []int64) {
	ids := (*C.int64_t)(C.calloc(C.size_t(max(capacity, 0))+1, 8))
	defer C.free(unsafe.Pointer(ids))
	acts := (*C.int32_t)(C.calloc(C.size_t(max(capacity, 0))+1, 4))
	defer C.free(unsafe.Pointer(acts))
	n := int32(call(ids, acts))
	var out []int64
	if n > 0 {
		for _, v := range unsafe.Slice(ids, n) {
			out = append(out, int64(v))
		}
	}
	return n, out
}

// abiDTRPlan calls memscale_dtr_plan's Go export; it returns the count (or
// -1), and the step kinds and ids when they were written (0 < count <= cap).
func abiDTRPlan(h, t int64, capacity int32) (int32, []int32, []int64) {
	kinds := (*C.int32_t)(C.calloc(C.size_t(max(capacity, 0))+1, 4))
	defer C.free(unsafe.Pointer(kinds))
	ids := (*C.int64_t)(C.calloc(C.size_t(max(capacity, 0))+1, 8))
	defer C.free(unsafe.Pointer(ids))
	n := int32(memscale_go_dtr_plan(C.int64_t(h), C.int64_t(t), kinds, ids, C.int32_t(capacity)))
	var ks []int32
	var is []int64
	if n > 0 && n <= capacity {
		for i := range int(n) {
			ks = append(ks, int32(unsafe.Slice(kinds, n)[i]))
			is = append(is, int64(unsafe.Slice(ids, n)[i]))
		}
	}
	return n, ks, is
}

// abiDTRPark calls memscale_dtr_park's Go export.
func abiDTRPark(h, t int64) int { return int(memscale_go_dtr_park(C.int64_t(h), C.int64_t(t))) }

// abiDTRAbandonPlans calls memscale_dtr_abandon_plans's Go export.
func abiDTRAbandonPlans(h int64) int { return int(memscale_go_dtr_abandon_plans(C.int64_t(h))) }

// abiDTRPlanCount calls memscale_dtr_plan's Go export with cap 0 and NULL
// arrays (asking for the number of steps).
func abiDTRPlanCount(h, t int64) int32 {
	return int32(memscale_go_dtr_plan(C.int64_t(h), C.int64_t(t), nil, nil, 0))
}

// abiDTRFinish calls memscale_dtr_finish's Go export.
func abiDTRFinish(h int64) int { return int(memscale_go_dtr_finish(C.int64_t(h))) }

// abiDTRSetBudget calls memscale_dtr_set_budget's Go export.
func abiDTRSetBudget(h, bytes int64) int {
	return int(memscale_go_dtr_set_budget(C.int64_t(h), C.int64_t(bytes)))
}

// abiDTRStatsJSON calls memscale_dtr_stats_json's Go export; "" means it
// failed.
func abiDTRStatsJSON(h int64) string {
	s := memscale_go_dtr_stats_json(C.int64_t(h))
	if s == nil {
		return ""
	}
	return goStringAndFree(s)
}

// dtrStatus is memscale_dtr_status in Go types, for tests.
type dtrStatus struct {
	Usage, Budget, Pending, BytesEvicted, PeakUsage, NextOp, NextTensor int64
}

// abiDTRStatus calls memscale_dtr_status_of's Go export; it returns the
// block's address (0 on error) and what it holds.
func abiDTRStatus(h int64) (uintptr, dtrStatus) {
	p := memscale_go_dtr_status_of(C.int64_t(h))
	if p == nil {
		return 0, dtrStatus{}
	}
	return uintptr(unsafe.Pointer(p)), dtrStatus{int64(p.usage), int64(p.budget), int64(p.pending),
		int64(p.bytes_evicted), int64(p.peak_usage), int64(p.next_op), int64(p.next_tensor)}
}

// dtrStatusLayout returns the size of memscale_dtr_status and the offsets of
// its fields in order, as C lays them out.
func dtrStatusLayout() (uintptr, []uintptr) {
	var s C.memscale_dtr_status
	return unsafe.Sizeof(s), []uintptr{unsafe.Offsetof(s.usage), unsafe.Offsetof(s.budget),
		unsafe.Offsetof(s.pending), unsafe.Offsetof(s.bytes_evicted), unsafe.Offsetof(s.peak_usage),
		unsafe.Offsetof(s.next_op), unsafe.Offsetof(s.next_tensor)}
}

// abiDTRName calls memscale_dtr_name's Go export (name "" passes NULL).
func abiDTRName(h int64, name string) int64 {
	if name == "" {
		return int64(memscale_go_dtr_name(C.int64_t(h), nil))
	}
	c := C.CString(name)
	defer C.free(unsafe.Pointer(c))
	return int64(memscale_go_dtr_name(C.int64_t(h), c))
}

// dtrRecord is one record of memscale_dtr_ops' frame (inputs nil: releases only).
type dtrRecord struct {
	name                      int64
	released, inputs          []int64
	sizes, alias              []int64
	cost, flags, op, firstOut int64
}

// abiDTROps calls memscale_dtr_ops' Go export with the records and room
// for capacity handed-out pairs; it returns its result (n or -1) and the
// handed-out (storage-root id, action) pairs. frame nil passes NULL.
func abiDTROps(h int64, records []dtrRecord, capacity int64) (int64, [][2]int64) {
	words := []int64{int64(len(records)), capacity}
	for _, r := range records {
		nIn := int64(len(r.inputs))
		if r.inputs == nil {
			nIn = -1
		}
		words = append(words, r.name, int64(len(r.released)), nIn, int64(len(r.sizes)), r.cost, r.flags, r.op, r.firstOut)
		words = append(words, r.released...)
		words = append(words, r.inputs...)
		words = append(words, r.sizes...)
		words = append(words, r.alias...)
	}
	n := max(len(words), int(1+2*capacity))
	p := (*C.int64_t)(C.calloc(C.size_t(n), 8))
	defer C.free(unsafe.Pointer(p))
	v := unsafe.Slice(p, n)
	for i, x := range words {
		v[i] = C.int64_t(x)
	}
	got := int64(memscale_go_dtr_ops(C.int64_t(h), p))
	if got < 0 {
		return got, nil
	}
	var freed [][2]int64
	for j := range int(v[0]) {
		freed = append(freed, [2]int64{int64(v[1+2*j]), int64(v[2+2*j])})
	}
	return got, freed
}

// abiDTROpsNoFrame calls memscale_dtr_ops' Go export with a NULL frame.
func abiDTROpsNoFrame(h int64) int64 { return int64(memscale_go_dtr_ops(C.int64_t(h), nil)) }

// abiDTRRematerialized calls memscale_dtr_rematerialized's Go export.
func abiDTRRematerialized(h, op, cost int64) int {
	return int(memscale_go_dtr_rematerialized(C.int64_t(h), C.int64_t(op), C.int64_t(cost)))
}

// cInt64s copies v into C memory (never NULL, so an empty array is valid).
func cInt64s(v []int64) *C.int64_t {
	p := (*C.int64_t)(C.calloc(C.size_t(len(v)+1), 8))
	for i, x := range v {
		unsafe.Slice(p, len(v))[i] = C.int64_t(x)
	}
	return p
}

// abiDTRTune calls memscale_dtr_tune; "" means it failed (see lastError).
func abiDTRTune(h int64) string {
	return goStringAndFree(memscale_go_dtr_tune(C.int64_t(h)))
}

// engineOf returns the engine of handle h (nil if there is none), for tests
// that look behind the ABI. The caller must not use it concurrently with
// calls on h.
func engineOf(h int64) *evict.Engine {
	d, err := dtrLookup(C.int64_t(h))
	if err != nil {
		return nil
	}
	return d.eng
}

// abiSetLimit calls memscale_set_limit's Go export.
func abiSetLimit(dev int, bytes int64) int {
	return int(memscale_go_set_limit(C.int(dev), C.int64_t(bytes)))
}

// abiSetThreshold calls memscale_set_threshold's Go export.
func abiSetThreshold(dev int, bytes int64) int {
	return int(memscale_go_set_threshold(C.int(dev), C.int64_t(bytes)))
}

// abiSetBudget calls memscale_set_budget's Go export.
func abiSetBudget(dev int, bytes int64) int {
	return int(memscale_go_set_budget(C.int(dev), C.int64_t(bytes)))
}

// abiSetBudgetSlack calls memscale_set_budget_slack's Go export.
func abiSetBudgetSlack(dev int, slack float64) int {
	return int(memscale_go_set_budget_slack(C.int(dev), C.double(slack)))
}

// abiStepBoundary calls memscale_step_boundary's Go export.
func abiStepBoundary(dev int) int {
	return int(memscale_go_step_boundary(C.int(dev)))
}

// abiSetReclaimer calls memscale_set_reclaimer's Go export with the test
// reclaimer r (nil: NULL, which removes the reclaimer).
func abiSetReclaimer(dev int, r *testReclaimer) int {
	if r == nil {
		return int(memscale_go_set_reclaimer(C.int(dev), 0, 0))
	}
	return int(memscale_go_set_reclaimer(C.int(dev), C.test_reclaimer_fn(), C.uintptr_t(uintptr(unsafe.Pointer(r.st)))))
}

// abiDTRReclaim calls memscale_dtr_reclaim's Go export with need and room
// for capacity victims; it returns the count (or -1) and the victim ids.
func abiDTRReclaim(h, need int64, capacity int32) (int32, []int64) {
	return abiVictims(capacity, func(ids *C.int64_t, acts *C.int32_t) C.int32_t {
		return memscale_go_dtr_reclaim(C.int64_t(h), C.int64_t(need), ids, acts, C.int32_t(capacity))
	})
}

// testReclaimerKind selects what the test reclaimer does (see the C code
// above).
type testReclaimerKind int

// The test reclaimer's kinds.
const (
	reclaimFreeNext testReclaimerKind = iota
	reclaimZero
	reclaimNegative
	reclaimNestedMalloc
	reclaimEngine
)

// testReclaimer is the C test reclaimer's state, in C memory.
type testReclaimer struct{ st *C.test_reclaim_state }

// newTestReclaimer returns a reclaimer of the given kind that asks engine
// (kind reclaimEngine) for victims; free releases its memory.
func newTestReclaimer(kind testReclaimerKind, engine int64) *testReclaimer {
	st := (*C.test_reclaim_state)(C.calloc(1, C.sizeof_test_reclaim_state))
	st.kind = C.int(kind)
	st.engine = C.int64_t(engine)
	return &testReclaimer{st: st}
}

// hold gives the reclaimer a block of size bytes (of tensor, for kind
// reclaimEngine) that it may free; it reports false when it has no room.
func (r *testReclaimer) hold(p uintptr, size, tensor int64) bool {
	i := int(r.st.n)
	if i >= C.TEST_RECLAIM_SLOTS {
		return false
	}
	r.st.ptrs[i] = C.uintptr_t(p)
	r.st.sizes[i] = C.int64_t(size)
	r.st.tensors[i] = C.int64_t(tensor)
	r.st.n++
	return true
}

// held returns the blocks the reclaimer holds and has not freed, with
// their sizes.
func (r *testReclaimer) held() map[uintptr]int64 {
	out := map[uintptr]int64{}
	for i := range int(r.st.n) {
		if r.st.ptrs[i] != 0 {
			out[uintptr(r.st.ptrs[i])] = int64(r.st.sizes[i])
		}
	}
	return out
}

// calls returns how many times the reclaimer was called, lastNeed the need
// and device of the last call, and nestedFailed how many of its own mallocs
// (kind reclaimNestedMalloc) failed.
func (r *testReclaimer) calls() int        { return int(r.st.calls) }
func (r *testReclaimer) lastNeed() int64   { return int64(r.st.last_need) }
func (r *testReclaimer) device() int       { return int(r.st.device) }
func (r *testReclaimer) nestedFailed() int { return int(r.st.nested_failed) }

// free releases the reclaimer's state (remove it from its device first).
func (r *testReclaimer) free() { C.free(unsafe.Pointer(r.st)) }
