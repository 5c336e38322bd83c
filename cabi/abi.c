// abi.c - the public C entry points of libmemscale.so, the fork guard and the
// last-error store.
//
// Fork guard: a pthread_atfork child handler, registered from a constructor
// when the library is loaded, sets a flag in the child. Every entry point
// checks it before calling into Go: a child created by fork() while the
// parent's Go runtime was busy can hang in the runtime (golang/go#15538), and
// PyTorch DataLoader workers fork by default and may free inherited CUDA
// tensors. In a child, memscale_malloc returns NULL, memscale_free and the
// other void hooks do nothing, int/int32/int64 calls (the DTR engine's
// memscale_dtr_* included) return -1, pointer calls (char*,
// memscale_dtr_status_of) return NULL, and memscale_last_error() returns a
// fixed message.
//
// Last error: per thread, as errno. Each thread has a ring of ERR_SLOTS
// buffers, allocated at its first error and freed when it exits (a
// pthread key's destructor; only the pointer is thread-local: the Go
// runtime makes the library's TLS static, where a dlopen'ed library gets
// little room); an error is copied into the recording thread's next slot,
// which becomes that thread's last error. A Go export runs on the C
// thread that called it (cgo runs a callback on the caller's thread), so the
// message lands with the thread whose call failed, and another thread's
// failures never show through memscale_last_error(). A pointer it returned
// stays valid and unchanged until ERR_SLOTS-1 more errors are recorded on the
// same thread (or the thread exits). The count stays process-wide (atomic).
// Nothing here takes a lock, so it is safe in a forked child too.

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memscale.h"
#include "memscale_internal.h"

#define ERR_SLOTS 8
#define ERR_LEN 2048

static const char forked_child_msg[] =
    "memscale: called in a child process created by fork(); the allocator is not "
    "available after fork (the Go runtime cannot be entered safely there): "
    "malloc returns NULL, free does nothing and the other calls (memscale_dtr_* included) fail";

static int forked; // set by the atfork child handler; read with __atomic_load_n

struct err_state {
	char ring[ERR_SLOTS][ERR_LEN];
	unsigned next;
	const char* current; // NULL: no error on this thread
};
static __thread struct err_state* err_tls; // this thread's, NULL until its first error
static pthread_key_t err_key;              // frees a thread's state when it exits
static pthread_once_t err_key_once = PTHREAD_ONCE_INIT;
static int err_count; // atomic, process-wide

static const char err_unstored_msg[] =
    "memscale: a call failed, but its error message could not be stored (out of memory)";

static void err_key_init(void) { (void)pthread_key_create(&err_key, free); }

// err_state_of_thread returns the calling thread's error state, allocating
// it on the first call; NULL when out of memory.
static struct err_state* err_state_of_thread(void) {
	if (err_tls == NULL) {
		struct err_state* s = calloc(1, sizeof *s);
		if (s == NULL) {
			return NULL;
		}
		(void)pthread_once(&err_key_once, err_key_init);
		(void)pthread_setspecific(err_key, s);
		err_tls = s;
	}
	return err_tls;
}

static void memscale_atfork_child(void) { __atomic_store_n(&forked, 1, __ATOMIC_RELAXED); }

__attribute__((constructor)) static void memscale_register_atfork(void) {
	// pthread_atfork only fails with ENOMEM; nothing useful can be done then,
	// and the constructor must not abort the host process.
	(void)pthread_atfork(NULL, NULL, memscale_atfork_child);
}

static inline int in_child(void) {
	return __builtin_expect(__atomic_load_n(&forked, __ATOMIC_RELAXED), 0);
}

// child_error counts a refused call in a forked child.
static void child_error(void) { __atomic_fetch_add(&err_count, 1, __ATOMIC_RELAXED); }

const char* memscale_record_error(const char* msg, size_t n) {
	static const char unknown[] = "memscale: unknown error";
	static const char ellipsis[] = " [...]";
	if (msg == NULL || n == 0) {
		msg = unknown;
		n = sizeof unknown - 1;
	}
	__atomic_fetch_add(&err_count, 1, __ATOMIC_RELAXED);
	if (in_child()) {
		return forked_child_msg;
	}
	struct err_state* st = err_state_of_thread();
	if (st == NULL) {
		return err_unstored_msg;
	}
	char* slot = st->ring[st->next % ERR_SLOTS];
	st->next++;
	if (n >= ERR_LEN) {
		// Truncate at a UTF-8 character boundary and mark the cut.
		size_t keep = ERR_LEN - sizeof ellipsis;
		while (keep > 0 && ((unsigned char)msg[keep] & 0xC0) == 0x80) {
			keep--;
		}
		memcpy(slot, msg, keep);
		memcpy(slot + keep, ellipsis, sizeof ellipsis); // includes the NUL
	} else {
		memcpy(slot, msg, n);
		slot[n] = '\0';
	}
	st->current = slot;
	return slot;
}

// ---- errors and strings: pure C, safe in a forked child -------------------

const char* memscale_last_error(void) {
	if (in_child()) {
		return forked_child_msg;
	}
	const struct err_state* st = err_tls;
	return st != NULL && st->current != NULL ? st->current : "";
}

int memscale_error_count(void) { return __atomic_load_n(&err_count, __ATOMIC_RELAXED); }

void memscale_clear_error(void) {
	if (err_tls != NULL) {
		err_tls->current = NULL;
	}
}

void memscale_string_free(char* s) { free(s); }

const char* memscale_version(void) { return "memscale " MEMSCALE_VERSION; }

// ---- PyTorch pluggable allocator -----------------------------------------

void* memscale_malloc(ssize_t size, int device, cudaStream_t stream) {
	if (in_child()) {
		child_error();
		return NULL;
	}
	return (void*)memscale_go_malloc((int64_t)size, device, (uintptr_t)stream);
}

void memscale_free(void* ptr, ssize_t size, int device, cudaStream_t stream) {
	if (in_child() || ptr == NULL) {
		return;
	}
	memscale_go_free((uintptr_t)ptr, (int64_t)size, device, (uintptr_t)stream);
}

int memscale_sim_stream_create(int device, cudaStream_t* stream) {
	if (in_child()) {
		child_error();
		return -1;
	}
	uintptr_t s = 0;
	int rc = memscale_go_sim_stream_create(device, stream == NULL ? NULL : &s);
	if (rc == 0) {
		*stream = (cudaStream_t)s;
	}
	return rc;
}

int memscale_sim_stream_destroy(int device, cudaStream_t stream) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_sim_stream_destroy(device, (uintptr_t)stream);
}

void memscale_init(int device_count) {
	if (in_child()) {
		return;
	}
	memscale_go_init(device_count);
}

void memscale_empty_cache(void) {
	if (in_child()) {
		return;
	}
	memscale_go_empty_cache();
}

void memscale_set_memory_fraction(double fraction, int device) {
	if (in_child()) {
		return;
	}
	memscale_go_set_memory_fraction(fraction, device);
}

void memscale_record_stream(void* ptr, cudaStream_t stream) {
	if (in_child()) {
		return;
	}
	memscale_go_record_stream((uintptr_t)ptr, (uintptr_t)stream);
}

// ---- statistics, snapshots, limits ----------------------------------------

char* memscale_stats_json(int device) {
	if (in_child()) {
		child_error();
		return NULL;
	}
	return memscale_go_stats_json(device);
}

char* memscale_snapshot_json(void) {
	if (in_child()) {
		child_error();
		return NULL;
	}
	return memscale_go_snapshot_json();
}

int memscale_reset_peak_stats(int device) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_reset_peak_stats(device);
}

int memscale_set_threshold(int device, int64_t bytes) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_set_threshold(device, bytes);
}

int memscale_set_budget(int device, int64_t bytes) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_set_budget(device, bytes);
}

int memscale_set_budget_slack(int device, double slack) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_set_budget_slack(device, slack);
}

int memscale_step_boundary(int device) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_step_boundary(device);
}

int memscale_set_limit(int device, int64_t bytes) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_set_limit(device, bytes);
}

/* Written by the Go side (cabi/alloc.go) after every malloc and free;
 * MEMSCALE_PUBLISHED_DEVICES matches cabi/state.go's maxDevices. */
int64_t memscale_published_allocated[MEMSCALE_PUBLISHED_DEVICES];

const int64_t* memscale_allocated_address(int device) {
	if (device < 0 || device >= MEMSCALE_PUBLISHED_DEVICES) {
		return NULL;
	}
	return &memscale_published_allocated[device];
}

int64_t memscale_allocated(int device) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_allocated(device);
}

const char* memscale_config_error(void) {
	if (in_child()) {
		return forked_child_msg;
	}
	return memscale_go_config_error();
}

char* memscale_config_json(void) {
	if (in_child()) {
		child_error();
		return NULL;
	}
	return memscale_go_config_json();
}

int memscale_set_reclaimer(int device, memscale_reclaimer fn, void* ctx) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_set_reclaimer(device, (uintptr_t)fn, (uintptr_t)ctx);
}

// ---- DTR engine ---------------------------------------------------------------
//
// The engine's state lives in Go: in a forked child every call fails. The
// Go side takes non-const pointers (cgo declares them so) and only reads
// config_json, name, inputs, out_sizes, out_alias and mutated.

int64_t memscale_dtr_create(const char* config_json) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_create((char*)config_json);
}

int memscale_dtr_destroy(int64_t h) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_destroy(h);
}

int memscale_dtr_set_budget(int64_t h, int64_t bytes) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_set_budget(h, bytes);
}

int64_t memscale_dtr_tensor(int64_t h, int64_t nbytes, int32_t pinned) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_tensor(h, nbytes, pinned);
}

int64_t memscale_dtr_call(int64_t h, const char* name, const int64_t* inputs, int32_t n_in,
                          const int64_t* out_sizes, const int32_t* out_alias, int32_t n_out,
                          int64_t cost_ns, int32_t flags, int64_t* out_ids) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_call(h, (char*)name, (int64_t*)inputs, n_in, (int64_t*)out_sizes,
	                            (int32_t*)out_alias, n_out, cost_ns, flags, out_ids);
}

int64_t memscale_dtr_op(int64_t h, const char* name, int64_t* frame) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_op(h, (char*)name, frame);
}

int64_t memscale_dtr_name(int64_t h, const char* name) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_name(h, (char*)name);
}

int64_t memscale_dtr_ops(int64_t h, int64_t* frame) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_ops(h, frame);
}

int64_t memscale_dtr_mutate(int64_t h, const char* name, const int64_t* inputs, int32_t n_in,
                            const int32_t* mutated, int32_t n_mut, int64_t cost_ns, int32_t flags,
                            int64_t* out_ids) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_mutate(h, (char*)name, (int64_t*)inputs, n_in, (int32_t*)mutated, n_mut,
	                              cost_ns, flags, out_ids);
}

int memscale_dtr_access(int64_t h, int64_t t) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_access(h, t);
}

int memscale_dtr_lock(int64_t h, int64_t t) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_lock(h, t);
}

int memscale_dtr_unlock(int64_t h, int64_t t) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_unlock(h, t);
}

int memscale_dtr_pin(int64_t h, int64_t t) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_pin(h, t);
}

int memscale_dtr_release(int64_t h, int64_t t) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_release(h, t);
}

int32_t memscale_dtr_evict(int64_t h, int64_t extra, int64_t* ids, int32_t* actions, int32_t cap) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_evict(h, extra, ids, actions, cap);
}

int32_t memscale_dtr_reclaim(int64_t h, int64_t need, int64_t* ids, int32_t* actions, int32_t cap) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_reclaim(h, need, ids, actions, cap);
}

int32_t memscale_dtr_plan(int64_t h, int64_t t, int32_t* kinds, int64_t* ids, int32_t cap) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_plan(h, t, kinds, ids, cap);
}

int memscale_dtr_abandon_plans(int64_t h) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_abandon_plans(h);
}

int memscale_dtr_park(int64_t h, int64_t t) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_park(h, t);
}

int memscale_dtr_rematerialized(int64_t h, int64_t op, int64_t cost_ns) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_rematerialized(h, op, cost_ns);
}

int memscale_dtr_swapped_in(int64_t h, int64_t t) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_swapped_in(h, t);
}

int memscale_dtr_finish(int64_t h) {
	if (in_child()) {
		child_error();
		return -1;
	}
	return memscale_go_dtr_finish(h);
}

// Python reads the block with ctypes (from_address): five int64 fields, in
// the header's order, no padding.
_Static_assert(sizeof(memscale_dtr_status) == 7 * sizeof(int64_t), "memscale_dtr_status: seven int64_t");
_Static_assert(offsetof(memscale_dtr_status, peak_usage) == 4 * sizeof(int64_t), "memscale_dtr_status: field order");

const memscale_dtr_status* memscale_dtr_status_of(int64_t h) {
	if (in_child()) {
		child_error();
		return NULL;
	}
	return memscale_go_dtr_status_of(h);
}

char* memscale_dtr_stats_json(int64_t h) {
	if (in_child()) {
		child_error();
		return NULL;
	}
	return memscale_go_dtr_stats_json(h);
}

char* memscale_dtr_tune(int64_t h) {
	if (in_child()) {
		child_error();
		return NULL;
	}
	return memscale_go_dtr_tune(h);
}
