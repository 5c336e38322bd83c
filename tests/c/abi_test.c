// abi_test.c - drives libmemscale.so through its C ABI the way PyTorch does.
//
//   gcc -O2 -Wall -Wextra -o build/abi_test tests/c/abi_test.c -ldl -lpthread
//   build/abi_test build/libmemscale.so
//
// The library is loaded with dlopen(RTLD_NOW) (like ctypes.CDLL) and every
// export is resolved with dlsym. By default the test runs on the sim backend
// (MEMSCALE_BACKEND=sim, set before loading), where device memory is host
// memory the test can write. Exit status 0 only if every check passed; the
// last line is "N passed, M failed".
//
// Device mode: with MEMSCALE_BACKEND=cuda or MEMSCALE_BACKEND=auto already in
// the environment, the backend is kept and the checks that need
// host-accessible memory or the 2 GiB sim card print "skip: <reason>" (not
// counted as passed or failed); capacity-relative sizes come from the
// device_total_bytes stat. If the first malloc fails there, the test prints
// "<backend> backend unavailable: <last error>" and exits 1. Its streams are
// real ones, made with cuStreamCreate through libcuda.so.1 (stream 0 when no
// driver can be loaded): a real driver refuses made-up handles. make test-c
// runs device mode on the fake libcuda.so.1 of device/cuda's tests, which
// refuses them too.
//
// Set ABI_TEST_SKIP_DTR=1 to skip the memscale_dtr_* engine exports (their
// presence, and the engine's "usage": "allocator" link to the allocators).

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../cabi/memscale.h" /* the public header, relative to this file */

#define KiB (1024LL)
#define MiB (1024LL * KiB)
#define GiB (1024LL * MiB)
#define PiB (1024LL * 1024LL * GiB)

#define SIM_CAPACITY_TEXT "2GiB"
#define SIM_CAPACITY (2 * GiB)

// ---- exports ----------------------------------------------------------------

#define FN(name) static __typeof__(&name) p_##name
FN(memscale_malloc);
FN(memscale_free);
FN(memscale_init);
FN(memscale_empty_cache);
FN(memscale_set_memory_fraction);
FN(memscale_record_stream);
FN(memscale_stats_json);
FN(memscale_snapshot_json);
FN(memscale_reset_peak_stats);
FN(memscale_set_threshold);
FN(memscale_set_limit);
FN(memscale_allocated);
FN(memscale_allocated_address);
FN(memscale_config_json);
FN(memscale_config_error);
FN(memscale_last_error);
FN(memscale_error_count);
FN(memscale_clear_error);
FN(memscale_string_free);
FN(memscale_version);
FN(memscale_set_reclaimer);

// DTR engine exports the tests call; NULL with ABI_TEST_SKIP_DTR=1.
FN(memscale_dtr_create);
FN(memscale_dtr_destroy);
FN(memscale_dtr_set_budget);
FN(memscale_dtr_tensor);
FN(memscale_dtr_name);
FN(memscale_dtr_ops);
FN(memscale_dtr_call);
FN(memscale_dtr_lock);
FN(memscale_dtr_release);
FN(memscale_dtr_evict);
FN(memscale_dtr_reclaim);
FN(memscale_dtr_plan);
FN(memscale_dtr_rematerialized);
FN(memscale_dtr_finish);
FN(memscale_dtr_status_of);
FN(memscale_dtr_stats_json);
FN(memscale_dtr_tune);

static const char* dtr_exports[] = {
    "memscale_dtr_create",   "memscale_dtr_destroy",         "memscale_dtr_set_budget",
    "memscale_dtr_tensor",   "memscale_dtr_call",            "memscale_dtr_mutate",
    "memscale_dtr_access",   "memscale_dtr_lock",            "memscale_dtr_unlock",
    "memscale_dtr_pin",      "memscale_dtr_release",         "memscale_dtr_evict",
    "memscale_dtr_plan",     "memscale_dtr_rematerialized",  "memscale_dtr_swapped_in",
    "memscale_dtr_stats_json", "memscale_dtr_tune",          "memscale_dtr_finish",
    "memscale_dtr_status_of", "memscale_dtr_reclaim",       "memscale_dtr_op",
    "memscale_dtr_name",     "memscale_dtr_ops",             "memscale_dtr_abandon_plans", "memscale_dtr_park",
};

// ---- reporting --------------------------------------------------------------

static int passed, failed, skipped;

// device_mode is set when MEMSCALE_BACKEND is cuda or auto (see the top of
// the file); device_total is then the device_total_bytes stat.
static int device_mode;
static int64_t device_total = SIM_CAPACITY;

// skip reports a check that does not apply in device mode.
static void skip(const char* reason) {
	skipped++;
	printf("skip: %s\n", reason);
}

static void check(int ok, const char* fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	if (ok) {
		passed++;
	} else {
		failed++;
		fprintf(stderr, "FAIL: ");
		vfprintf(stderr, fmt, ap);
		fprintf(stderr, " (last error: %s)\n", p_memscale_last_error ? p_memscale_last_error() : "?");
	}
	va_end(ap);
}

static int contains(const char* s, const char* sub) { return s != NULL && strstr(s, sub) != NULL; }

// expect_error checks that the error count grew by one or more since before
// and that the last error mentions every one of the NULL-terminated words.
static void expect_error(int before, const char* what, ...) {
	const char* e = p_memscale_last_error();
	check(p_memscale_error_count() > before, "%s: error count did not grow", what);
	check(e != NULL && e[0] != '\0', "%s: last error is empty", what);
	va_list ap;
	va_start(ap, what);
	for (const char* w = va_arg(ap, const char*); w != NULL; w = va_arg(ap, const char*)) {
		check(contains(e, w), "%s: last error does not mention \"%s\": %s", what, w, e ? e : "(null)");
	}
	va_end(ap);
}

static void expect_no_error(int before, const char* what) {
	check(p_memscale_error_count() == before, "%s: unexpected error", what);
}

// stat_value returns the integer value of "key" in a flat JSON object, or
// INT64_MIN if absent.
static int64_t stat_value(const char* json, const char* key) {
	char pat[256];
	snprintf(pat, sizeof pat, "\"%s\":", key);
	const char* p = json ? strstr(json, pat) : NULL;
	if (p == NULL) {
		return INT64_MIN;
	}
	return strtoll(p + strlen(pat), NULL, 10);
}

static int64_t device_stat(const char* key) {
	char* js = p_memscale_stats_json(0);
	int64_t v = stat_value(js, key);
	p_memscale_string_free(js);
	return v;
}

// json_balanced checks that braces and brackets nest properly outside strings.
static int json_balanced(const char* s) {
	char stack[256];
	int depth = 0, in_str = 0;
	for (; *s; s++) {
		char c = *s;
		if (in_str) {
			if (c == '\\' && s[1]) {
				s++;
			} else if (c == '"') {
				in_str = 0;
			}
			continue;
		}
		if (c == '"') {
			in_str = 1;
		} else if (c == '{' || c == '[') {
			if (depth == (int)sizeof stack) {
				return 0;
			}
			stack[depth++] = c;
		} else if (c == '}' || c == ']') {
			if (depth == 0 || stack[depth - 1] != (c == '}' ? '{' : '[')) {
				return 0;
			}
			depth--;
		}
	}
	return depth == 0 && !in_str;
}

// ---- tests --------------------------------------------------------------------

// stream_a is the legacy default stream. stream_b and the worker threads'
// streams are made on the sim with memscale_sim_stream_create
// (make_sim_streams); in device mode they are real streams made with
// cuStreamCreate (make_device_streams). Both refuse a made-up handle, as a
// real driver answers it with CUDA_ERROR_INVALID_HANDLE.
enum { NWORKERS = 4 };
static cudaStream_t stream_a = (cudaStream_t)0;
static cudaStream_t stream_b;
static cudaStream_t worker_streams[NWORKERS];

// make_sim_streams makes the test's streams on the simulated device 0.
// Returns 0 when that fails.
static int make_sim_streams(void* h) {
	int (*create)(int, cudaStream_t*) = (int (*)(int, cudaStream_t*))dlsym(h, "memscale_sim_stream_create");
	if (create == NULL) {
		printf("sim mode: no memscale_sim_stream_create: %s\n", dlerror());
		return 0;
	}
	int ok = create(0, &stream_b) == 0;
	for (int i = 0; i < NWORKERS && ok; i++) ok = create(0, &worker_streams[i]) == 0;
	if (!ok) printf("sim mode: memscale_sim_stream_create failed: %s\n", p_memscale_last_error());
	return ok;
}

// test_made_up_stream (sim mode): a handle that is not a stream of the
// device is refused by malloc and free, with an error naming it.
static void test_made_up_stream(void) {
	cudaStream_t bogus = (cudaStream_t)(uintptr_t)0xdeadbeef;
	int before = p_memscale_error_count();
	check(p_memscale_malloc(4096, 0, bogus) == NULL, "malloc on a made-up stream returns NULL");
	expect_error(before, "malloc on a made-up stream", "memscale_malloc", "stream 0xdeadbeef", "not a stream of this device",
	             NULL);
	void* p = p_memscale_malloc(4096, 0, stream_b);
	check(p != NULL, "malloc on a created stream");
	before = p_memscale_error_count();
	p_memscale_free(p, 4096, 0, bogus);
	expect_error(before, "free on a made-up stream", "memscale_free", "stream 0xdeadbeef", "not freed", NULL);
	before = p_memscale_error_count();
	p_memscale_free(p, 4096, 0, stream_b);
	expect_no_error(before, "free on its own stream after the refused free");
	p_memscale_empty_cache();
}

// The driver entry points device mode uses to make streams (NULL otherwise).
typedef int (*cu_stream_fn)(cudaStream_t*, unsigned int);
typedef int (*cu_stream_destroy_fn)(cudaStream_t);
static cu_stream_fn cu_stream_create;
static cu_stream_destroy_fn cu_stream_destroy;

// make_device_streams loads libcuda.so.1, makes device 0's primary context
// current on this thread and creates the test's streams in it. Without a
// driver (MEMSCALE_BACKEND=auto falling back to the sim) every stream is the
// legacy stream 0, valid everywhere. Returns 0 when the driver fails.
static int make_device_streams(void) {
	void* cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (cu == NULL) {
		printf("device mode: no libcuda.so.1 (%s): every stream is stream 0\n", dlerror());
		stream_b = 0;
		for (int i = 0; i < NWORKERS; i++) worker_streams[i] = 0;
		return 1;
	}
	int (*cu_init)(unsigned int) = (int (*)(unsigned int))dlsym(cu, "cuInit");
	int (*cu_device_get)(int*, int) = (int (*)(int*, int))dlsym(cu, "cuDeviceGet");
	int (*cu_retain)(void**, int) = (int (*)(void**, int))dlsym(cu, "cuDevicePrimaryCtxRetain");
	int (*cu_set_current)(void*) = (int (*)(void*))dlsym(cu, "cuCtxSetCurrent");
	cu_stream_create = (cu_stream_fn)dlsym(cu, "cuStreamCreate");
	cu_stream_destroy = (cu_stream_destroy_fn)dlsym(cu, "cuStreamDestroy_v2");
	if (!cu_init || !cu_device_get || !cu_retain || !cu_set_current || !cu_stream_create || !cu_stream_destroy) {
		printf("device mode: libcuda.so.1 lacks a stream entry point\n");
		return 0;
	}
	int dev = 0, r;
	void* ctx = NULL;
	if ((r = cu_init(0)) != 0 || (r = cu_device_get(&dev, 0)) != 0 || (r = cu_retain(&ctx, dev)) != 0 ||
	    (r = cu_set_current(ctx)) != 0 || (r = cu_stream_create(&stream_b, 1)) != 0) {
		printf("device mode: making a stream on device 0 failed: CUresult %d\n", r);
		return 0;
	}
	for (int i = 0; i < NWORKERS; i++) {
		if ((r = cu_stream_create(&worker_streams[i], 1)) != 0) {
			printf("device mode: making a worker stream failed: CUresult %d\n", r);
			return 0;
		}
	}
	printf("device mode: streams made with cuStreamCreate\n");
	return 1;
}

// test_destroyed_stream (device mode with a driver): memory cached on a
// stream the program then destroys must still be released by empty_cache,
// without an error and without touching it: memscale never calls the driver
// with a stream after the call that handed it over (on a real driver a
// destroyed handle dangles; the first GPU run crashed here, 2026-11-27). The
// fake driver counts such calls; make test-c requires none.
static void test_destroyed_stream(void) {
	if (cu_stream_create == NULL) {
		return;
	}
	cudaStream_t s = NULL;
	check(cu_stream_create(&s, 1) == 0, "destroyed stream: cuStreamCreate");
	int before = p_memscale_error_count();
	void* p = p_memscale_malloc(6 * MiB, 0, s);
	check(p != NULL, "destroyed stream: malloc on it");
	p_memscale_free(p, 6 * MiB, 0, s);
	check(cu_stream_destroy(s) == 0, "destroyed stream: cuStreamDestroy");
	p_memscale_empty_cache();
	expect_no_error(before, "destroyed stream: empty_cache after the stream was destroyed");
	check(device_stat("reserved_bytes.all.current") == 0, "destroyed stream: its cached memory was released");
	// Later pressure does not touch it either.
	void* q = p_memscale_malloc(6 * MiB, 0, stream_b);
	check(q != NULL, "destroyed stream: malloc on another stream");
	p_memscale_free(q, 6 * MiB, 0, stream_b);
	p_memscale_empty_cache();
	expect_no_error(before, "destroyed stream: no error later");
}

static void test_basics(void) {
	check(contains(p_memscale_version(), "memscale "), "version: %s", p_memscale_version());
	check(strcmp(p_memscale_last_error(), "") == 0, "last error is empty at start");
	check(p_memscale_error_count() == 0, "error count is 0 at start");
	int before = p_memscale_error_count();
	p_memscale_init(1);
	expect_no_error(before, "init");
	p_memscale_string_free(NULL);
}

struct alloc {
	unsigned char* p;
	int64_t size;
	cudaStream_t stream;
	unsigned char tag;
};

static int cmp_alloc(const void* a, const void* b) {
	const struct alloc* x = a;
	const struct alloc* y = b;
	return (x->p > y->p) - (x->p < y->p);
}

static void fill(struct alloc* a) {
	if (a->size <= 64 * KiB) {
		memset(a->p, a->tag, (size_t)a->size);
	} else {
		// Touch the first and last page and a few in between.
		for (int64_t off = 0; off < a->size; off += a->size / 7 + 1) {
			a->p[off] = a->tag;
		}
		a->p[a->size - 1] = a->tag;
		a->p[0] = a->tag;
	}
}

static int verify(const struct alloc* a) {
	if (a->size <= 64 * KiB) {
		for (int64_t i = 0; i < a->size; i++) {
			if (a->p[i] != a->tag) {
				return 0;
			}
		}
		return 1;
	}
	for (int64_t off = 0; off < a->size; off += a->size / 7 + 1) {
		if (a->p[off] != a->tag) {
			return 0;
		}
	}
	return a->p[a->size - 1] == a->tag && a->p[0] == a->tag;
}

static void test_many_pairs(void) {
	static const int64_t sizes[] = {1,       7,        511,     512,      513,       4 * KiB,
	                                64 * KiB, 1 * MiB - 1, 1 * MiB, 1 * MiB + 1, 3 * MiB, 10 * MiB,
	                                20 * MiB, 33 * MiB, 100 * MiB};
	const int nsizes = (int)(sizeof sizes / sizeof sizes[0]);
	enum { LIVE = 60 };
	struct alloc live[LIVE];
	int before = p_memscale_error_count();
	int ok_alloc = 1, ok_data = 1, ok_overlap = 1;
	unsigned seed = 12345;

	for (int round = 0; round < 20; round++) {
		int64_t total = 0;
		for (int i = 0; i < LIVE; i++) {
			seed = seed * 1103515245u + 12345u;
			struct alloc* a = &live[i];
			a->size = sizes[(seed >> 8) % (unsigned)nsizes];
			a->stream = (i % 2) ? stream_b : stream_a;
			a->tag = (unsigned char)(i + round * 7 + 1);
			a->p = p_memscale_malloc(a->size, 0, a->stream);
			if (a->p == NULL) {
				ok_alloc = 0;
				a->size = 0;
				continue;
			}
			if (!device_mode) {
				fill(a);
			}
			total += a->size;
		}
		int64_t allocated = p_memscale_allocated(0);
		check(allocated >= total, "round %d: allocated %lld < requested %lld", round, (long long)allocated,
		      (long long)total);
		check(*p_memscale_allocated_address(0) == allocated, "round %d: the published allocated bytes %lld = %lld",
		      round, (long long)*p_memscale_allocated_address(0), (long long)allocated);
		for (int i = 0; i < LIVE && !device_mode; i++) {
			if (live[i].p && !verify(&live[i])) {
				ok_data = 0;
			}
		}
		struct alloc sorted[LIVE];
		memcpy(sorted, live, sizeof sorted);
		qsort(sorted, LIVE, sizeof sorted[0], cmp_alloc);
		for (int i = 1; i < LIVE; i++) {
			if (sorted[i - 1].p && sorted[i - 1].p + sorted[i - 1].size > sorted[i].p) {
				ok_overlap = 0;
			}
		}
		// Free in a scrambled order, with the size and stream PyTorch passes.
		for (int k = 0; k < LIVE; k++) {
			int i = (k * 37 + round) % LIVE;
			if (live[i].p) {
				p_memscale_free(live[i].p, live[i].size, 0, live[i].stream);
			}
		}
	}
	check(ok_alloc, "many pairs: every allocation succeeded");
	if (device_mode) {
		skip("many pairs: data written into every allocation reads back (device memory is not host-accessible)");
	} else {
		check(ok_data, "many pairs: data written into every allocation reads back");
	}
	check(ok_overlap, "many pairs: live allocations do not overlap");
	check(p_memscale_allocated(0) == 0, "many pairs: allocated is 0 after freeing all, got %lld",
	      (long long)p_memscale_allocated(0));
	check(*p_memscale_allocated_address(0) == 0, "many pairs: the published allocated bytes are 0 too");
	check(p_memscale_allocated_address(-1) == NULL && p_memscale_allocated_address(64) == NULL,
	      "memscale_allocated_address: NULL out of range");
	expect_no_error(before, "many pairs");
}

static void test_record_stream_and_empty_cache(void) {
	int before = p_memscale_error_count();
	unsigned char* p = p_memscale_malloc(8 * MiB, 0, stream_a);
	check(p != NULL, "record_stream: malloc");
	if (p == NULL) {
		return;
	}
	if (!device_mode) {
		memset(p, 0xab, 8 * MiB);
	}
	p_memscale_record_stream(p, stream_b);
	expect_no_error(before, "record_stream on a live pointer");
	p_memscale_free(p, 8 * MiB, 0, stream_a);
	expect_no_error(before, "free after record_stream");
	check(device_stat("reserved_bytes.all.current") > 0, "reserved memory is cached before empty_cache");
	p_memscale_empty_cache();
	expect_no_error(before, "empty_cache");
	check(device_stat("reserved_bytes.all.current") == 0, "empty_cache releases all cached memory, reserved=%lld",
	      (long long)device_stat("reserved_bytes.all.current"));

	before = p_memscale_error_count();
	p_memscale_record_stream((void*)(uintptr_t)0x7777000, stream_b);
	expect_error(before, "record_stream of an unknown pointer", "memscale_record_stream", "0x7777000", NULL);
}

static void test_stats(void) {
	static const char* keys[] = {
	    "allocated_bytes.all.current", "allocated_bytes.all.peak",   "allocated_bytes.small_pool.current",
	    "allocated_bytes.large_pool.allocated", "reserved_bytes.all.current", "reserved_bytes.all.peak",
	    "active_bytes.all.current",    "allocation.all.current",     "segment.all.current",
	    "requested_bytes.all.current", "inactive_split_bytes.all.current", "num_alloc_retries",
	    "num_ooms",
	};
	int before = p_memscale_error_count();
	void* p = p_memscale_malloc(3 * MiB, 0, stream_a);
	char* js = p_memscale_stats_json(0);
	check(js != NULL && js[0] == '{' && json_balanced(js), "stats JSON is an object");
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
		check(stat_value(js, keys[i]) != INT64_MIN, "stats JSON has key %s", keys[i]);
	}
	check(stat_value(js, "allocated_bytes.all.current") >= 3 * MiB, "stats: allocated >= 3 MiB while live");
	check(stat_value(js, "requested_bytes.all.current") == 3 * MiB, "stats: requested == 3 MiB while live");
	p_memscale_string_free(js);
	p_memscale_free(p, 3 * MiB, 0, stream_a);
	check(device_stat("allocated_bytes.all.peak") >= 3 * MiB, "peak kept after free");
	check(p_memscale_reset_peak_stats(0) == 0, "reset_peak_stats returns 0");
	check(device_stat("allocated_bytes.all.peak") == device_stat("allocated_bytes.all.current"),
	      "peak == current after reset_peak_stats");
	expect_no_error(before, "stats");

	before = p_memscale_error_count();
	check(p_memscale_stats_json(-1) == NULL, "stats_json(-1) is NULL");
	expect_error(before, "stats of device -1", "memscale_stats_json", "device -1", NULL);
	before = p_memscale_error_count();
	check(p_memscale_reset_peak_stats(1000) == -1, "reset_peak_stats(1000) is -1");
	expect_error(before, "reset_peak_stats of device 1000", "device 1000", NULL);
}

static void test_snapshot_and_config(void) {
	int before = p_memscale_error_count();
	void* p = p_memscale_malloc(5 * MiB, 0, stream_b);
	char* snap = p_memscale_snapshot_json();
	check(snap != NULL && snap[0] == '{', "snapshot JSON is an object");
	check(json_balanced(snap), "snapshot JSON brackets balance");
	check(contains(snap, "\"segments\":["), "snapshot has segments");
	check(contains(snap, "\"device_traces\":["), "snapshot has device_traces");
	check(contains(snap, "\"blocks\""), "snapshot segments have blocks");
	check(contains(snap, "active_allocated"), "snapshot shows the live block as active_allocated");
	p_memscale_string_free(snap);
	p_memscale_free(p, 5 * MiB, 0, stream_b);

	char* cfg = p_memscale_config_json();
	check(cfg != NULL && json_balanced(cfg), "config JSON");
	if (device_mode) {
		char want[64];
		snprintf(want, sizeof want, "\"backend\":\"%s\"", getenv("MEMSCALE_BACKEND"));
		check(contains(cfg, want), "config JSON names the %s backend: %s", getenv("MEMSCALE_BACKEND"), cfg ? cfg : "");
		skip("config JSON has the 2 GiB sim capacity (not the sim backend)");
	} else {
		check(contains(cfg, "\"backend\":\"sim\""), "config JSON names the sim backend: %s", cfg ? cfg : "");
		check(contains(cfg, "\"sim_capacity\":2147483648"), "config JSON has the sim capacity");
	}
	check(contains(cfg, "\"devices\":[{\"ordinal\":0"), "config JSON lists device 0");
	check(contains(cfg, "\"version\":\"memscale "), "config JSON has the version");
	p_memscale_string_free(cfg);
	check(p_memscale_config_error() == NULL, "memscale_config_error is NULL: the configuration was accepted (%s)",
	      p_memscale_config_error() ? p_memscale_config_error() : "");
	expect_no_error(before, "snapshot and config");
}

static void test_limits(void) {
	int before = p_memscale_error_count();
	// A quarter of the card (2 GiB on the sim): half of it (1 GiB) does not
	// fit, an eighth (256 MiB) does. On a real device use 3/8 rather than
	// half, so that the fraction 1.0 allocation leaves room for the context.
	int64_t big = device_mode ? (device_total * 3 / 8) / MiB * MiB : 1 * GiB;
	int64_t small = device_mode ? (device_total / 8) / MiB * MiB : 256 * MiB;
	p_memscale_set_memory_fraction(0.25, 0);
	expect_no_error(before, "set_memory_fraction(0.25)");
	void* p = p_memscale_malloc(big, 0, stream_a);
	check(p == NULL, "%lld MiB fails under a 0.25 fraction", (long long)(big / MiB));
	expect_error(before, "big allocation under fraction 0.25", "memscale_malloc", "out of memory", NULL);
	p = p_memscale_malloc(small, 0, stream_a);
	check(p != NULL, "%lld MiB fits under a 0.25 fraction", (long long)(small / MiB));
	p_memscale_free(p, small, 0, stream_a);
	p_memscale_set_memory_fraction(1.0, 0);
	before = p_memscale_error_count();
	p = p_memscale_malloc(big, 0, stream_a);
	check(p != NULL, "%lld MiB fits with fraction 1.0", (long long)(big / MiB));
	p_memscale_free(p, big, 0, stream_a);
	expect_no_error(before, "fraction 1.0");

	before = p_memscale_error_count();
	p_memscale_set_memory_fraction(1.5, 0);
	expect_error(before, "fraction 1.5", "memscale_set_memory_fraction", "1.5", NULL);
	before = p_memscale_error_count();
	p_memscale_set_memory_fraction(NAN, 0);
	expect_error(before, "fraction NaN", "NaN", NULL);
	before = p_memscale_error_count();
	p_memscale_set_memory_fraction(0.5, -3);
	expect_error(before, "fraction on device -3", "device -3", NULL);

	before = p_memscale_error_count();
	check(p_memscale_set_limit(0, 512 * MiB) == 0, "set_limit(512 MiB)");
	p = p_memscale_malloc(600 * MiB, 0, stream_a);
	check(p == NULL, "600 MiB fails under a 512 MiB limit");
	expect_error(before, "600 MiB under a 512 MiB limit", "out of memory", NULL);
	check(p_memscale_set_limit(0, 0) == 0, "set_limit(0) restores the capacity");
	before = p_memscale_error_count();
	p = p_memscale_malloc(600 * MiB, 0, stream_a);
	check(p != NULL, "600 MiB fits after the limit is lifted");
	p_memscale_free(p, 600 * MiB, 0, stream_a);
	expect_no_error(before, "limit lifted");
	check(p_memscale_set_limit(0, -1) == -1, "set_limit(-1) is -1");
	expect_error(before, "negative limit", "memscale_set_limit", "negative", NULL);
	before = p_memscale_error_count();
	check(p_memscale_set_limit(0, device_mode ? device_total + 64 * GiB : 64 * GiB) == -1,
	      "set_limit above the device is -1");
	expect_error(before, "limit above the device", "memscale_set_limit", NULL);

	before = p_memscale_error_count();
	check(p_memscale_set_threshold(0, 1 * GiB) == 0, "set_threshold(1 GiB)");
	check(p_memscale_set_threshold(0, 0) == 0, "set_threshold(0)");
	expect_no_error(before, "set_threshold");
	check(p_memscale_set_threshold(0, -5) == -1, "set_threshold(-5) is -1");
	expect_error(before, "negative threshold", "memscale_set_threshold", "negative", NULL);
	p_memscale_empty_cache();
}

static void test_bad_inputs(void) {
	int before;

	before = p_memscale_error_count();
	p_memscale_free((void*)(uintptr_t)0xdead0000, 64, 0, stream_a);
	expect_error(before, "free of an unknown pointer", "memscale_free", "0xdead0000", "not allocated", NULL);

	before = p_memscale_error_count();
	void* p = p_memscale_malloc(4096, 0, stream_a);
	check(p != NULL, "malloc for double free");
	p_memscale_free(p, 4096, 0, stream_a);
	expect_no_error(before, "first free");
	p_memscale_free(p, 4096, 0, stream_a);
	expect_error(before, "double free", "memscale_free", "double free", NULL);

	before = p_memscale_error_count();
	void* z1 = p_memscale_malloc(0, 0, stream_a);
	void* z2 = p_memscale_malloc(0, 0, stream_a);
	check(z1 != NULL && z2 != NULL && z1 != z2, "size 0 gives unique non-NULL pointers (%p, %p)", z1, z2);
	p_memscale_free(z1, 0, 0, stream_a);
	p_memscale_free(z2, 0, 0, stream_a);
	expect_no_error(before, "size 0 malloc/free");

	before = p_memscale_error_count();
	check(p_memscale_malloc(-5, 0, stream_a) == NULL, "negative size gives NULL");
	expect_error(before, "negative size", "memscale_malloc", "-5", "negative", NULL);

	before = p_memscale_error_count();
	check(p_memscale_malloc(PiB, 0, stream_a) == NULL, "1 PiB gives NULL");
	expect_error(before, "1 PiB", "memscale_malloc", "1125899906842624", NULL);

	before = p_memscale_error_count();
	check(p_memscale_malloc(INT64_MAX, 0, stream_a) == NULL, "INT64_MAX bytes gives NULL");
	expect_error(before, "INT64_MAX bytes", "memscale_malloc", NULL);

	before = p_memscale_error_count();
	check(p_memscale_malloc(64, -1, stream_a) == NULL, "device -1 gives NULL");
	expect_error(before, "device -1", "memscale_malloc", "device -1", NULL);
	before = p_memscale_error_count();
	check(p_memscale_malloc(64, 5000, stream_a) == NULL, "device 5000 gives NULL");
	expect_error(before, "device 5000", "device 5000", NULL);

	// Size mismatch: reported, and the block is still freed.
	before = p_memscale_error_count();
	int64_t base = p_memscale_allocated(0);
	p = p_memscale_malloc(10000, 0, stream_a);
	check(p != NULL, "malloc for the size mismatch");
	p_memscale_free(p, 20000, 0, stream_a);
	expect_error(before, "free with the wrong size", "memscale_free", "20000", "10000", NULL);
	check(p_memscale_allocated(0) == base, "the block was freed despite the size mismatch");

	// free(NULL) is a no-op, like free(3).
	before = p_memscale_error_count();
	p_memscale_free(NULL, 0, 0, stream_a);
	expect_no_error(before, "free(NULL)");

	// The process lives on and the allocator still works.
	before = p_memscale_error_count();
	p = p_memscale_malloc(1 * MiB, 0, stream_a);
	check(p != NULL, "malloc after the bad inputs");
	p_memscale_free(p, 1 * MiB, 0, stream_a);
	expect_no_error(before, "after the bad inputs");
}

static void test_last_error_storage(void) {
	int before = p_memscale_error_count();
	p_memscale_free((void*)(uintptr_t)0xabc000, 1, 0, stream_a);
	const char* first = p_memscale_last_error();
	char copy[4096];
	snprintf(copy, sizeof copy, "%s", first);
	check(contains(first, "0xabc000"), "first error names its pointer");
	// A few more errors must not change the string the caller holds.
	for (int i = 0; i < 5; i++) {
		p_memscale_free((void*)(uintptr_t)(0xdef000 + 0x1000 * i), 1, 0, stream_a);
	}
	check(strcmp(first, copy) == 0, "a returned last_error string is stable across later errors");
	check(p_memscale_error_count() == before + 6, "error count counts each error");
	int count = p_memscale_error_count();
	p_memscale_clear_error();
	check(strcmp(p_memscale_last_error(), "") == 0, "clear_error empties last_error");
	check(p_memscale_error_count() == count, "clear_error keeps the count");
}

// test_last_error_per_thread: memscale_last_error() is per thread, as errno.
// Two threads make failing calls that name a device of their own and read
// the last error after each; issue 32 saw hundreds of reads return the other
// thread's message when it was process-wide.
#define LAST_ERROR_CALLS 20000
struct last_error_worker {
	int device;
	int wrong;
	int before_clear;
};

static void* last_error_worker(void* arg) {
	struct last_error_worker* w = arg;
	char want[64];
	snprintf(want, sizeof want, "device %d", w->device);
	for (int i = 0; i < LAST_ERROR_CALLS; i++) {
		if (p_memscale_set_threshold(w->device, 0) != -1 || !contains(p_memscale_last_error(), want)) {
			w->wrong++;
		}
	}
	w->before_clear = p_memscale_last_error()[0] != '\0';
	p_memscale_clear_error();
	if (p_memscale_last_error()[0] != '\0') {
		w->wrong++;
	}
	return NULL;
}

static void test_last_error_per_thread(void) {
	struct last_error_worker ws[2] = {{.device = 901}, {.device = 902}};
	pthread_t th[2];
	int before = p_memscale_error_count();
	p_memscale_free((void*)(uintptr_t)0xabc000, 1, 0, stream_a); // an error of the main thread
	char mine[4096];
	snprintf(mine, sizeof mine, "%s", p_memscale_last_error());
	for (int i = 0; i < 2; i++) {
		check(pthread_create(&th[i], NULL, last_error_worker, &ws[i]) == 0, "pthread_create");
	}
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
	}
	for (int i = 0; i < 2; i++) {
		check(ws[i].wrong == 0, "thread of device %d: %d of %d reads were not its own error", ws[i].device, ws[i].wrong,
		      LAST_ERROR_CALLS);
		check(ws[i].before_clear, "thread of device %d had a last error before clearing", ws[i].device);
	}
	check(strcmp(p_memscale_last_error(), mine) == 0 && contains(mine, "0xabc000"),
	      "the main thread's last error is its own after the other threads' (%s)", p_memscale_last_error());
	check(p_memscale_error_count() == before + 1 + 2 * LAST_ERROR_CALLS, "every thread's errors are counted");
	p_memscale_clear_error();
}

// test_dtr_allocator_usage checks the link between the engine and the
// allocators: an engine created with "usage": "allocator" sees the
// allocator's allocated bytes of its device.
static void test_dtr_allocator_usage(void* h) {
	__typeof__(&memscale_dtr_create) create = (__typeof__(create))dlsym(h, "memscale_dtr_create");
	__typeof__(&memscale_dtr_destroy) destroy = (__typeof__(destroy))dlsym(h, "memscale_dtr_destroy");
	__typeof__(&memscale_dtr_stats_json) stats = (__typeof__(stats))dlsym(h, "memscale_dtr_stats_json");
	if (!create || !destroy || !stats) {
		check(0, "dtr exports for the allocator-usage test");
		return;
	}
	int before = p_memscale_error_count();
	int64_t e = create("{\"usage\": \"allocator\", \"device\": 0}");
	check(e > 0, "dtr_create with usage allocator on device 0 returns a handle (%lld)", (long long)e);
	void* p = p_memscale_malloc(3 * MiB, 0, stream_a);
	check(p != NULL, "dtr usage: malloc");
	char* js = e > 0 ? stats(e) : NULL;
	int64_t usage = stat_value(js, "usage");
	check(usage >= 3 * MiB && usage == p_memscale_allocated(0),
	      "dtr usage allocator: engine usage %lld == allocated %lld", (long long)usage,
	      (long long)p_memscale_allocated(0));
	p_memscale_string_free(js);
	p_memscale_free(p, 3 * MiB, 0, stream_a);
	check(e <= 0 || destroy(e) == 0, "dtr_destroy");
	expect_no_error(before, "dtr with allocator usage");

	before = p_memscale_error_count();
	check(create("{\"usage\": \"allocator\", \"device\": 1}") == -1,
	      "dtr_create with usage allocator on a device the sim lacks fails");
	expect_error(before, "dtr usage allocator on device 1", "memscale_dtr_create", "device 1", NULL);
}

// test_dtr_tune runs a step on an engine with the auto policy (a chain of
// activations kept for a backward pass, under half of its peak, evicting
// as told), tunes it, and creates the next engine from the chosen config.
static void test_dtr_tune(void) {
	int before = p_memscale_error_count();
	const int n = 12;
	const int64_t act = 1000;
	char cfg[256];
	snprintf(cfg, sizeof cfg, "{\"budget\": %lld, \"heuristic\": \"auto\", \"usage\": \"engine\"}",
	         (long long)(act * n / 2));
	int64_t e = p_memscale_dtr_create(cfg);
	check(e > 0, "dtr_create with heuristic auto (%lld)", (long long)e);
	if (e <= 0) return;
	int64_t x = p_memscale_dtr_tensor(e, 100, 1);
	int64_t ids[16];
	int32_t acts[16];
	int ok = x >= 0;
	for (int i = 0; i < n && ok; i++) {
		int64_t sizes[1] = {act};
		int32_t alias[1] = {-1};
		int64_t out[1];
		int64_t in[1] = {x};
		ok = p_memscale_dtr_call(e, "layer", in, 1, sizes, alias, 1, 1000 * (i + 1), 0, out) >= 0;
		while (ok && p_memscale_dtr_evict(e, 0, ids, acts, 16) > 0) {
		}
		x = out[0];
	}
	check(ok, "auto engine: a chain of %d ops under half its peak", n);
	char* js = p_memscale_dtr_tune(e);
	check(js != NULL && contains(js, "\"config\"") && contains(js, "\"choice\"") && json_balanced(js),
	      "dtr_tune returns the choice as JSON: %.120s", js ? js : p_memscale_last_error());
	if (js != NULL) {
		// the "config" object is what the next engine is created with
		char* start = strstr(js, "\"config\":");
		char* end = start ? strchr(start, '}') : NULL;
		if (start && end) {
			start += strlen("\"config\":");
			char next[512];
			snprintf(next, sizeof next, "%.*s", (int)(end - start + 1), start);
			int64_t e2 = p_memscale_dtr_create(next);
			check(e2 > 0, "the tuned config creates an engine: %s", next);
			if (e2 > 0) p_memscale_dtr_destroy(e2);
		} else {
			check(0, "dtr_tune JSON has a config object");
		}
		p_memscale_string_free(js);
	}
	check(p_memscale_dtr_destroy(e) == 0, "dtr_destroy of the auto engine");
	expect_no_error(before, "dtr tune");

	before = p_memscale_error_count();
	e = p_memscale_dtr_create("{\"budget\": 1000, \"heuristic\": \"dtr\"}");
	check(e > 0 && p_memscale_dtr_tune(e) == NULL, "dtr_tune of an engine that does not record is NULL");
	expect_error(before, "dtr_tune without recording", "memscale_dtr_tune", "does not record", NULL);
	if (e > 0) p_memscale_dtr_destroy(e);
}

// dtr_op runs one op of one fresh output of size bytes reading in on engine
// e; it returns the output's id, or -1.
static int64_t dtr_op(int64_t e, int64_t in, int64_t size) {
	int64_t ins[1] = {in};
	int64_t sizes[1] = {size};
	int32_t alias[1] = {-1};
	int64_t out[1] = {-1};
	if (p_memscale_dtr_call(e, "op", ins, 1, sizes, alias, 1, 1000, 0, out) < 0) {
		return -1;
	}
	return out[0];
}

// reclaim_ctx is what the reclaimer of test_dtr_reclaimer works with: the
// engine, and per output tensor of it the block that holds its storage.
struct reclaim_ctx {
	int64_t engine;
	int64_t tensors[3];
	void* blocks[3];
	int64_t size;
	int calls;
};

// engine_reclaimer is a reclaimer as the Python package's is: it asks the
// engine for victims (memscale_dtr_reclaim, until it returns less than its
// cap) and frees their blocks.
static int64_t engine_reclaimer(int device, int64_t need, void* ctx) {
	struct reclaim_ctx* rc = ctx;
	rc->calls++;
	int64_t ids[2];
	int32_t acts[2];
	int64_t freed = 0;
	int32_t n;
	do {
		n = p_memscale_dtr_reclaim(rc->engine, need, ids, acts, 2);
		for (int32_t k = 0; k < n; k++) {
			for (int i = 0; i < 3; i++) {
				if (rc->blocks[i] != NULL && rc->tensors[i] == ids[k]) {
					p_memscale_free(rc->blocks[i], rc->size, device, stream_a);
					rc->blocks[i] = NULL;
					freed += rc->size;
				}
			}
		}
	} while (n == 2);
	return freed;
}

// test_dtr_reclaimer checks the reclaimer and memscale_dtr_reclaim together:
// under a 64 MiB limit with three 16 MiB outputs of an LRU engine allocated,
// a 32 MiB request succeeds because the reclaimer evicts the oldest output
// and frees its block; with the others locked, the request fails and the
// error names the engine's shortfall.
static void test_dtr_reclaimer(void) {
	int before = p_memscale_error_count();
	struct reclaim_ctx rc = {.size = 16 * MiB};
	rc.engine = p_memscale_dtr_create("{\"heuristic\": \"lru\"}");
	check(rc.engine > 0, "dtr_create for the reclaimer test (%lld)", (long long)rc.engine);
	if (rc.engine <= 0) return;
	int64_t x = p_memscale_dtr_tensor(rc.engine, 100, 1);
	for (int i = 0; i < 3; i++) {
		x = rc.tensors[i] = dtr_op(rc.engine, x, rc.size);
		rc.blocks[i] = p_memscale_malloc(rc.size, 0, stream_a);
		check(x >= 0 && rc.blocks[i] != NULL, "reclaimer test: output %d and its block", i);
	}
	check(p_memscale_set_limit(0, 64 * MiB) == 0, "reclaimer test: set_limit(64 MiB)");
	check(p_memscale_set_reclaimer(0, engine_reclaimer, &rc) == 0, "set_reclaimer");
	void* p = p_memscale_malloc(32 * MiB, 0, stream_a);
	check(p != NULL, "32 MiB over the limit succeeds: the reclaimer evicted");
	check(rc.calls == 1 && rc.blocks[0] == NULL && rc.blocks[1] != NULL && rc.blocks[2] != NULL,
	      "the reclaimer was called once and freed the oldest output's block (%d calls)", rc.calls);
	char* js = p_memscale_dtr_stats_json(rc.engine);
	check(stat_value(js, "bytes_evicted") == 16 * MiB && stat_value(js, "reclaim_victims") == 1,
	      "the engine counts the reclaim victim: %s", js ? js : "(null)");
	p_memscale_string_free(js);
	expect_no_error(before, "reclaimer that evicts");
	p_memscale_free(p, 32 * MiB, 0, stream_a);

	// The remaining outputs locked: nothing to evict, and the error says why.
	p = p_memscale_malloc(32 * MiB, 0, stream_a); // fills the limit again
	check(p != NULL, "32 MiB fits again");
	check(p_memscale_dtr_lock(rc.engine, rc.tensors[1]) == 0 && p_memscale_dtr_lock(rc.engine, rc.tensors[2]) == 0,
	      "lock the remaining outputs");
	before = p_memscale_error_count();
	check(p_memscale_malloc(16 * MiB, 0, stream_a) == NULL, "16 MiB more fails: nothing evictable");
	expect_error(before, "reclaim shortfall", "out of memory", "the reclaimer was asked 1 time and freed 0 B",
	             "the DTR engine could not free enough", "nothing more is evictable", "2 locked", NULL);

	check(p_memscale_set_reclaimer(0, NULL, NULL) == 0, "set_reclaimer(NULL)");
	before = p_memscale_error_count();
	check(p_memscale_malloc(16 * MiB, 0, stream_a) == NULL, "16 MiB more fails without a reclaimer");
	expect_error(before, "no reclaimer", "no reclaimer installed", NULL);
	check(!contains(p_memscale_last_error(), "DTR engine"), "no shortfall without a reclaim");
	p_memscale_free(p, 32 * MiB, 0, stream_a);
	for (int i = 1; i < 3; i++) {
		p_memscale_free(rc.blocks[i], rc.size, 0, stream_a);
	}
	check(p_memscale_set_limit(0, 0) == 0, "reclaimer test: limit lifted");
	check(p_memscale_dtr_destroy(rc.engine) == 0, "reclaimer test: destroy");
	p_memscale_empty_cache();
}

// test_dtr_status_plan_finish checks the status block, memscale_dtr_evict's
// extra, memscale_dtr_plan's count protocol and memscale_dtr_finish on a
// chain x -> t0 -> t1 -> t2 of 100-byte storages under a budget of 250.
static void test_dtr_status_plan_finish(void) {
	int before = p_memscale_error_count();
	int64_t e = p_memscale_dtr_create("{\"budget\": 250, \"heuristic\": \"lru\"}");
	check(e > 0, "dtr_create for the status test (%lld)", (long long)e);
	if (e <= 0) return;
	const memscale_dtr_status* st = p_memscale_dtr_status_of(e);
	check(st != NULL, "dtr_status_of returns the block");
	if (st == NULL) {
		p_memscale_dtr_destroy(e);
		return;
	}
	check(sizeof *st == 56, "memscale_dtr_status is seven int64_t");
	check(st->usage == 0 && st->budget == 250 && st->pending == 0 && st->bytes_evicted == 0 && st->peak_usage == 0 &&
	          st->next_op == 0 && st->next_tensor == 0,
	      "status after create: usage %lld budget %lld", (long long)st->usage, (long long)st->budget);
	int64_t x = p_memscale_dtr_tensor(e, 100, 1);
	int64_t t[3];
	int64_t prev = x;
	for (int i = 0; i < 3; i++) {
		t[i] = prev = dtr_op(e, prev, 100);
	}
	check(x >= 0 && t[2] >= 0, "status test: the chain runs");
	check(st->usage == 400 && st->peak_usage == 400, "status follows the calls: usage %lld peak %lld",
	      (long long)st->usage, (long long)st->peak_usage);
	check(st->next_op == 3 && st->next_tensor == 4, "status names the next ids: op %lld tensor %lld",
	      (long long)st->next_op, (long long)st->next_tensor);
	expect_no_error(before, "dtr status: chain");

	// Two ops of 0 bytes in one memscale_dtr_ops call, their ids predicted
	// from the status block; the second releases the first's output.
	int64_t name = p_memscale_dtr_name(e, "batched");
	check(name >= 0 && p_memscale_dtr_name(e, "batched") == name, "dtr_name: one id per name (%lld)", (long long)name);
	int64_t op0 = st->next_op, out0 = st->next_tensor;
	int64_t frame[32] = {2, 4,
	                     name, 0, 1, 1, 5, 0, op0, out0, t[2], 0, -1,
	                     name, 1, 1, 1, 5, 0, op0 + 1, out0 + 1, out0, t[2], 0, -1};
	check(p_memscale_dtr_ops(e, frame) == 2, "dtr_ops applies both records");
	check(st->next_op == op0 + 2 && st->next_tensor == out0 + 2, "dtr_ops: the ids were the predicted ones");
	int64_t wrong[16] = {1, 0, name, 0, 1, 1, 5, 0, op0, out0, t[2], 0, -1};
	before = p_memscale_error_count();
	check(p_memscale_dtr_ops(e, wrong) == -1, "dtr_ops refuses a record whose ids were predicted wrong");
	expect_error(before, "dtr_ops wrong ids", "memscale_dtr_ops", "record 0 of 1", "the caller expected", NULL);
	check(st->next_op == op0 + 2, "a refused record changes nothing");
	before = p_memscale_error_count();

	int64_t ids[16];
	int32_t acts[16];
	before = p_memscale_error_count();
	check(p_memscale_dtr_evict(e, -1, ids, acts, 16) == -1, "dtr_evict with a negative extra fails");
	expect_error(before, "dtr_evict extra -1", "memscale_dtr_evict", "extra -1", NULL);
	before = p_memscale_error_count();
	check(p_memscale_dtr_evict(e, 251, ids, acts, 16) == -1, "dtr_evict with an extra larger than the budget fails");
	expect_error(before, "dtr_evict extra 251", "an allocation of 251 bytes is larger than the whole budget of 250 bytes",
	             "plus the pinned bytes (100 now)", NULL);
	check(st->usage == 400 && st->bytes_evicted == 0, "nothing evicted for an allocation larger than the budget");
	before = p_memscale_error_count();
	int32_t n = p_memscale_dtr_evict(e, 150, ids, acts, 16);
	check(n == 3 && ids[0] == t[0] && ids[1] == t[1] && ids[2] == t[2] && acts[0] == 0,
	      "dtr_evict makes room for extra: %d victims", n);
	check(st->usage == 100 && st->bytes_evicted == 300 && st->pending == 0,
	      "status after evict: usage %lld bytes_evicted %lld", (long long)st->usage, (long long)st->bytes_evicted);

	// plan: the count as snprintf gives it, nothing written or held when
	// cap is too small
	check(p_memscale_dtr_plan(e, t[2], NULL, NULL, 0) == 3, "dtr_plan with cap 0 returns the number of steps");
	int32_t kinds[4] = {-9, -9, -9, -9};
	int64_t steps[4] = {-9, -9, -9, -9};
	check(p_memscale_dtr_plan(e, t[2], kinds, steps, 2) == 3 && kinds[0] == -9 && steps[0] == -9,
	      "dtr_plan with too small a cap writes nothing");
	expect_no_error(before, "dtr_plan with too small a cap");
	check(p_memscale_dtr_plan(e, t[2], kinds, steps, 4) == 3 && kinds[0] == 0 && kinds[1] == 0 && kinds[2] == 0 &&
	          kinds[3] == -9,
	      "dtr_plan with room writes the steps");
	for (int i = 0; i < 3; i++) {
		check(p_memscale_dtr_rematerialized(e, steps[i], 500) == 0, "dtr_rematerialized step %d", i);
	}
	check(st->usage == 400, "status after the re-runs: usage %lld", (long long)st->usage);
	before = p_memscale_error_count();
	check(p_memscale_dtr_plan(e, 987654, kinds, steps, 4) == -1, "dtr_plan of an unknown tensor fails");
	expect_error(before, "dtr_plan unknown tensor", "memscale_dtr_plan", NULL);

	// t2 is gone for good when released: pending until evict hands it out
	before = p_memscale_error_count();
	check(p_memscale_dtr_release(e, t[2]) == 0 && st->pending == 1, "status counts pending storages (%lld)",
	      (long long)st->pending);
	check(p_memscale_dtr_lock(e, t[0]) == 0 && p_memscale_dtr_lock(e, t[1]) == 0, "dtr_lock");
	check(p_memscale_dtr_evict(e, 0, ids, acts, 16) == 1 && ids[0] == t[2] && st->pending == 0,
	      "dtr_evict hands out the pending storage");
	expect_no_error(before, "dtr pending");
	check(p_memscale_dtr_evict(e, 0, ids, acts, 16) == -1, "dtr_evict over the budget with nothing evictable fails");
	expect_error(before, "dtr_evict nothing evictable", "nothing evictable", NULL);

	// finish: the budget still binds (a run never goes over it before
	// raising); the errors name what leaves the step
	before = p_memscale_error_count();
	check(p_memscale_dtr_finish(e) == 0 && p_memscale_dtr_finish(e) == 0, "dtr_finish, twice");
	check(p_memscale_dtr_evict(e, 0, ids, acts, 16) == -1, "dtr_evict after finish over the budget still fails");
	expect_error(before, "dtr_evict after finish", "is below what leaves this step", NULL);
	before = p_memscale_error_count();
	check(p_memscale_dtr_evict(e, 1000, ids, acts, 16) == -1, "dtr_evict after finish with a huge extra fails");
	expect_error(before, "dtr_evict after finish, huge extra", "larger than the whole budget", NULL);
	check(st->usage == 300 && st->budget == 250, "usage unchanged after finish");
	before = p_memscale_error_count();
	char* js = p_memscale_dtr_stats_json(e);
	check(contains(js, "\"finished\":true") && contains(js, "\"bytes_evicted\":300") && contains(js, "\"auto\":false") &&
	          contains(js, "\"config\":{") && contains(js, "\"evictee_min_size\":0") && json_balanced(js),
	      "dtr_stats_json has finished, bytes_evicted, auto and config: %.300s", js ? js : "(null)");
	p_memscale_string_free(js);
	expect_no_error(before, "dtr finish");

	check(p_memscale_dtr_destroy(e) == 0, "dtr_destroy of the status engine");
	before = p_memscale_error_count();
	check(p_memscale_dtr_status_of(e) == NULL, "dtr_status_of after destroy is NULL");
	check(p_memscale_dtr_finish(e) == -1, "dtr_finish after destroy fails");
	expect_error(before, "dtr after destroy", "unknown engine handle", NULL);
}

// test_dtr_region_defaults checks "defaults": "region", and that it sees
// MEMSCALE_HEURISTIC as set with setenv after the library was loaded.
static void test_dtr_region_defaults(void) {
	const char* saved = getenv("MEMSCALE_HEURISTIC");
	char* keep = saved ? strdup(saved) : NULL;
	static const char cfg[] = "{\"defaults\": \"region\", \"budget\": 1000000}";
	struct {
		const char* env; // NULL: unset
		const char* want[3];
	} cases[] = {
	    {NULL, {"\"auto\":true", "\"heuristic\":\"auto\"", "\"evictee_min_size\":1024"}},
	    {"lru", {"\"auto\":false", "\"heuristic\":\"lru\"", "\"evictee_min_size\":1024"}},
	    {"Auto", {"\"auto\":true", "\"heuristic\":\"auto\"", "\"evictee_min_size\":1024"}},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		if (cases[i].env) {
			setenv("MEMSCALE_HEURISTIC", cases[i].env, 1);
		} else {
			unsetenv("MEMSCALE_HEURISTIC");
		}
		int before = p_memscale_error_count();
		int64_t e = p_memscale_dtr_create(cfg);
		char* js = e > 0 ? p_memscale_dtr_stats_json(e) : NULL;
		for (int k = 0; k < 3; k++) {
			check(contains(js, cases[i].want[k]), "region defaults, MEMSCALE_HEURISTIC=%s: %s in %.400s",
			      cases[i].env ? cases[i].env : "(unset)", cases[i].want[k], js ? js : p_memscale_last_error());
		}
		p_memscale_string_free(js);
		if (e > 0) p_memscale_dtr_destroy(e);
		expect_no_error(before, "region defaults");
	}
	if (keep) {
		setenv("MEMSCALE_HEURISTIC", keep, 1);
		free(keep);
	} else {
		unsetenv("MEMSCALE_HEURISTIC");
	}
	int before = p_memscale_error_count();
	check(p_memscale_dtr_create("{\"defaults\": \"engine\"}") == -1, "dtr_create with defaults other than region fails");
	expect_error(before, "defaults engine", "memscale_dtr_create", "accepted \"region\"", NULL);
}

// ---- threads and fork ---------------------------------------------------------

static volatile int stop_worker;
static volatile long worker_iters;
static volatile int worker_bad;

static void* worker(void* arg) {
	uintptr_t id = (uintptr_t)arg;
	cudaStream_t s = worker_streams[id];
	long n = 0;
	while (!stop_worker) {
		int64_t size = (int64_t)(512 << (n % 12)); // 512 B .. 1 MiB
		unsigned char* p = p_memscale_malloc(size, 0, s);
		if (p == NULL) {
			worker_bad = 1;
			break;
		}
		if (!device_mode) {
			p[0] = (unsigned char)n;
			p[size - 1] = (unsigned char)n;
			if (p[0] != (unsigned char)n) {
				worker_bad = 1;
			}
		}
		p_memscale_free(p, size, 0, s);
		n++;
	}
	__atomic_fetch_add(&worker_iters, n, __ATOMIC_RELAXED);
	return NULL;
}

static void test_threads(void) {
	int before = p_memscale_error_count();
	pthread_t th[NWORKERS];
	stop_worker = 0;
	worker_iters = 0;
	worker_bad = 0;
	for (uintptr_t i = 0; i < NWORKERS; i++) {
		pthread_create(&th[i], NULL, worker, (void*)i);
	}
	usleep(300 * 1000);
	stop_worker = 1;
	for (int i = 0; i < NWORKERS; i++) {
		pthread_join(th[i], NULL);
	}
	check(!worker_bad, "threads: every malloc succeeded and memory was writable");
	check(worker_iters > 1000, "threads: %ld malloc/free pairs in 0.3 s", worker_iters);
	expect_no_error(before, "threads");
	check(p_memscale_allocated(0) == 0, "threads: nothing left allocated");
}

// fork_engine is a DTR engine the parent created before forking (0 when the
// DTR exports are skipped): the child's calls on it must be refused, not
// run.
static int64_t fork_engine;

// child_dtr_after_fork calls the engine exports in the forked child: each
// returns -1 (NULL for char*) without entering Go, even on the parent's
// live handle, and counts an error.
static int child_dtr_after_fork(void) {
	if (p_memscale_dtr_create == NULL) {
		return 0;
	}
	int bad = 0;
	int before = p_memscale_error_count();
	int64_t inputs[1] = {1};
	int64_t sizes[1] = {4096};
	int32_t alias[1] = {-1};
	int64_t out_ids[1] = {-7};
	int64_t ids[4];
	int32_t acts[4];
	if (p_memscale_dtr_create("{}") != -1) bad |= 1 << 12;
	if (p_memscale_dtr_set_budget(fork_engine, 1 * MiB) != -1) bad |= 1 << 13;
	if (p_memscale_dtr_tensor(fork_engine, 4096, 0) != -1) bad |= 1 << 14;
	if (p_memscale_dtr_call(fork_engine, "relu", inputs, 1, sizes, alias, 1, 1000, 0, out_ids) != -1 ||
	    out_ids[0] != -7)
		bad |= 1 << 15;
	if (p_memscale_dtr_evict(fork_engine, 0, ids, acts, 4) != -1) bad |= 1 << 16;
	if (p_memscale_dtr_reclaim(fork_engine, 4096, ids, acts, 4) != -1) bad |= 1 << 24;
	if (p_memscale_dtr_stats_json(fork_engine) != NULL) bad |= 1 << 17;
	if (p_memscale_dtr_tune(fork_engine) != NULL) bad |= 1 << 21;
	if (p_memscale_dtr_finish(fork_engine) != -1) bad |= 1 << 22;
	if (p_memscale_dtr_status_of(fork_engine) != NULL) bad |= 1 << 23;
	if (p_memscale_dtr_destroy(fork_engine) != -1) bad |= 1 << 18;
	if (p_memscale_error_count() != before + 11) bad |= 1 << 19;
	if (!contains(p_memscale_last_error(), "fork")) bad |= 1 << 20;
	return bad;
}

// child_after_fork runs in the forked child: nothing may hang (alarm kills a
// hung child with SIGALRM, which the parent reports). It returns a mask of
// the failed checks.
static int child_after_fork(void* inherited) {
	alarm(5);
	int bad = 0;
	p_memscale_free(inherited, 4096, 0, stream_a); // no-op in the child
	if (p_memscale_malloc(4096, 0, stream_a) != NULL) bad |= 1;
	if (!contains(p_memscale_last_error(), "fork")) bad |= 2;
	if (p_memscale_stats_json(0) != NULL) bad |= 4;
	if (p_memscale_snapshot_json() != NULL) bad |= 8;
	if (p_memscale_config_json() != NULL) bad |= 16;
	if (p_memscale_allocated(0) != -1) bad |= 32;
	if (p_memscale_set_limit(0, 0) != -1) bad |= 64;
	if (p_memscale_set_threshold(0, 0) != -1) bad |= 128;
	if (p_memscale_reset_peak_stats(0) != -1) bad |= 256;
	if (p_memscale_set_reclaimer(0, NULL, NULL) != -1) bad |= 2048;
	p_memscale_empty_cache();
	p_memscale_record_stream(inherited, stream_b);
	p_memscale_set_memory_fraction(0.5, 0);
	p_memscale_init(1);
	p_memscale_clear_error();
	p_memscale_string_free(NULL);
	if (!contains(p_memscale_version(), "memscale")) bad |= 512;
	(void)p_memscale_error_count();
	// The inherited memory itself is still readable in the child (sim).
	if (!device_mode && ((volatile unsigned char*)inherited)[0] != 0x42) bad |= 1024;
	bad |= child_dtr_after_fork();
	return bad;
}

// child_exit reports the child's mask on stderr (an exit status keeps only
// 8 bits) and exits 1 if any check failed. stdio is not used: another
// thread may have held its lock at fork time.
static void child_exit(int bad) {
	if (bad) {
		char msg[96];
		int n = snprintf(msg, sizeof msg, "fork child %d: failed checks, mask %#x\n", (int)getpid(), bad);
		if (n > 0) {
			ssize_t w = write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
			(void)w;
		}
	}
	_exit(bad ? 1 : 0);
}

static void test_fork(void) {
	unsigned char* inherited = p_memscale_malloc(4096, 0, stream_a);
	check(inherited != NULL, "fork: malloc before fork");
	if (inherited == NULL) {
		return;
	}
	if (device_mode) {
		skip("fork: the child reads the inherited memory (device memory is not host-accessible)");
	} else {
		inherited[0] = 0x42;
	}
	fork_engine = 0;
	if (p_memscale_dtr_create != NULL) {
		fork_engine = p_memscale_dtr_create("{\"budget\": 0}");
		check(fork_engine > 0, "fork: dtr_create before fork returns a handle (%lld)", (long long)fork_engine);
	}
	pthread_t th[2];
	stop_worker = 0;
	worker_iters = 0;
	worker_bad = 0;
	for (uintptr_t i = 0; i < 2; i++) {
		pthread_create(&th[i], NULL, worker, (void*)i); // ids index worker_streams
	}
	usleep(20 * 1000);
	int children_ok = 1;
	for (int k = 0; k < 20; k++) {
		fflush(NULL);
		pid_t pid = fork();
		if (pid < 0) {
			check(0, "fork: %s", strerror(errno));
			break;
		}
		if (pid == 0) {
			child_exit(child_after_fork(inherited));
		}
		int status = 0;
		while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
		}
		if (WIFSIGNALED(status)) {
			children_ok = 0;
			fprintf(stderr, "fork child %d killed by signal %d%s\n", k, WTERMSIG(status),
			        WTERMSIG(status) == SIGALRM ? " (hung: watchdog fired)" : "");
		} else if (WEXITSTATUS(status) != 0) {
			children_ok = 0;
			fprintf(stderr, "fork child %d failed checks (exit status %d; mask above)\n", k, WEXITSTATUS(status));
		}
		usleep(2000);
	}
	stop_worker = 1;
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
	}
	check(children_ok, "fork: 20 children forked during a malloc/free loop neither hung nor entered Go "
	                   "(allocator and memscale_dtr_* calls refused)");
	check(!worker_bad, "fork: the parent's workers kept working");
	int before = p_memscale_error_count();
	p_memscale_free(inherited, 4096, 0, stream_a);
	void* p = p_memscale_malloc(4096, 0, stream_a);
	check(p != NULL, "fork: the parent still allocates");
	p_memscale_free(p, 4096, 0, stream_a);
	if (fork_engine > 0) {
		// The children's refused calls left the parent's engine as it was.
		int64_t t = p_memscale_dtr_tensor(fork_engine, 4096, 0);
		check(t >= 0, "fork: the parent's engine still registers tensors (%lld)", (long long)t);
		char* js = p_memscale_dtr_stats_json(fork_engine);
		check(stat_value(js, "usage") == 4096, "fork: the parent's engine usage is its one tensor: %s", js ? js : "(null)");
		p_memscale_string_free(js);
		check(p_memscale_dtr_destroy(fork_engine) == 0, "fork: the parent destroys its engine");
		fork_engine = 0;
	}
	expect_no_error(before, "fork: parent after the children");
	check(p_memscale_last_error()[0] == '\0' || !contains(p_memscale_last_error(), "fork"),
	      "fork: the parent's last error is not the child's message");
}

// ---- bad configuration (runs in a fresh process) ------------------------------

static int bad_config_main(void) {
	int bad = 0;
	if (p_memscale_malloc(4096, 0, stream_a) != NULL) bad |= 1;
	const char* e = p_memscale_last_error();
	if (!contains(e, "MEMSCALE_EVICTION_THRESHOLD") || !contains(e, "banana")) bad |= 2;
	if (!contains(e, "GiB") || !contains(e, "%")) bad |= 4; // says what is accepted
	if (p_memscale_config_json() != NULL) bad |= 8;
	const char* ce = p_memscale_config_error();
	if (!contains(ce, "MEMSCALE_EVICTION_THRESHOLD") || !contains(ce, "banana")) bad |= 128;
	if (p_memscale_config_error() != ce) bad |= 256; // static, the same every time
	if (p_memscale_allocated(0) != -1) bad |= 16;
	if (p_memscale_malloc(4096, 0, stream_a) != NULL) bad |= 32; // every malloc fails
	if (p_memscale_error_count() < 4) bad |= 64;
	if (bad) {
		fprintf(stderr, "bad-config child: mask %#x, last error: %s\n", bad, e);
	}
	return bad;
}

static void test_bad_config(const char* self, const char* lib) {
	fprintf(stderr, "abi_test: expected below: the library logs ERROR rejecting MEMSCALE_EVICTION_THRESHOLD=banana "
	                "(this test gives it on purpose)\n");
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		setenv("MEMSCALE_EVICTION_THRESHOLD", "banana", 1);
		execl("/proc/self/exe", self, lib, "--bad-config", (char*)NULL);
		_exit(127);
	}
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
	}
	check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "bad MEMSCALE_EVICTION_THRESHOLD: malloc returns NULL with the variable named (status %#x)", status);
}

// ---- main ---------------------------------------------------------------------------

static void* must_sym(void* h, const char* name) {
	void* f = dlsym(h, name);
	check(f != NULL, "dlsym(%s): %s", name, f ? "" : dlerror());
	return f;
}

// probe_device runs in device mode before the tests: one malloc/free on
// device 0 (no error is recorded when it works, so test_basics still sees
// a clean state) and the device_total_bytes stat. If the backend cannot be
// used it prints one line and returns 0 instead of letting every check fail.
static int probe_device(void) {
	const char* backend = getenv("MEMSCALE_BACKEND");
	void* p = p_memscale_malloc(4096, 0, stream_a);
	if (p == NULL) {
		printf("%s backend unavailable: %s\n", backend, p_memscale_last_error());
		return 0;
	}
	p_memscale_free(p, 4096, 0, stream_a);
	p_memscale_empty_cache();
	int64_t total = device_stat("device_total_bytes");
	if (total <= 0) {
		printf("%s backend: no usable device_total_bytes stat (%lld): %s\n", backend, (long long)total,
		       p_memscale_last_error());
		return 0;
	}
	device_total = total;
	printf("device mode: MEMSCALE_BACKEND=%s, device_total_bytes=%lld\n", backend, (long long)total);
	return 1;
}

#define LOAD(name) p_##name = (__typeof__(p_##name))must_sym(h, #name)

int main(int argc, char** argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: %s path/to/libmemscale.so\n", argv[0]);
		return 2;
	}
	int bad_config = argc > 2 && strcmp(argv[2], "--bad-config") == 0;
	const char* backend_env = getenv("MEMSCALE_BACKEND");
	device_mode = backend_env != NULL && (strcmp(backend_env, "cuda") == 0 || strcmp(backend_env, "auto") == 0);
	if (device_mode) {
		// Keep the backend; a sim fallback under "auto" still gets the small card.
		setenv("MEMSCALE_SIM_CAPACITY", SIM_CAPACITY_TEXT, 0);
	} else {
		setenv("MEMSCALE_BACKEND", "sim", 1);
		setenv("MEMSCALE_SIM_CAPACITY", SIM_CAPACITY_TEXT, 1);
	}
	if (!getenv("MEMSCALE_LOG_LEVEL")) {
		setenv("MEMSCALE_LOG_LEVEL", "error", 1); // the bad inputs would log warnings
	}
	if (!bad_config) {
		fprintf(stderr, "abi_test: expected: the library's ERROR lines below answer bad input given on purpose "
		                "(an unknown device, a malformed variable); a failed check prints FAIL\n");
	}

	void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		fprintf(stderr, "dlopen(%s, RTLD_NOW): %s\n", argv[1], dlerror());
		printf("0 passed, 1 failed\n");
		return 1;
	}
	LOAD(memscale_malloc);
	LOAD(memscale_free);
	LOAD(memscale_allocated_address);
	LOAD(memscale_init);
	LOAD(memscale_empty_cache);
	LOAD(memscale_set_memory_fraction);
	LOAD(memscale_record_stream);
	LOAD(memscale_stats_json);
	LOAD(memscale_snapshot_json);
	LOAD(memscale_reset_peak_stats);
	LOAD(memscale_set_threshold);
	LOAD(memscale_set_limit);
	LOAD(memscale_allocated);
	LOAD(memscale_config_json);
	LOAD(memscale_config_error);
	LOAD(memscale_last_error);
	LOAD(memscale_error_count);
	LOAD(memscale_clear_error);
	LOAD(memscale_string_free);
	LOAD(memscale_version);
	LOAD(memscale_set_reclaimer);
	must_sym(h, "memscale_malloc_or_throw"); // C++ callers only: tests/c/throw_test.cpp
	if (failed) {
		printf("%d passed, %d failed\n", passed, failed);
		return 1;
	}
	if (bad_config) {
		return bad_config_main();
	}
	const char* skip_env = getenv("ABI_TEST_SKIP_DTR");
	int skip_dtr = skip_env != NULL && strcmp(skip_env, "1") == 0;
	if (!skip_dtr) {
		for (size_t i = 0; i < sizeof dtr_exports / sizeof dtr_exports[0]; i++) {
			must_sym(h, dtr_exports[i]);
		}
		LOAD(memscale_dtr_create);
		LOAD(memscale_dtr_destroy);
		LOAD(memscale_dtr_set_budget);
		LOAD(memscale_dtr_tensor);
		LOAD(memscale_dtr_name);
		LOAD(memscale_dtr_ops);
		LOAD(memscale_dtr_call);
		LOAD(memscale_dtr_lock);
		LOAD(memscale_dtr_release);
		LOAD(memscale_dtr_evict);
		LOAD(memscale_dtr_reclaim);
		LOAD(memscale_dtr_plan);
		LOAD(memscale_dtr_rematerialized);
		LOAD(memscale_dtr_finish);
		LOAD(memscale_dtr_status_of);
		LOAD(memscale_dtr_stats_json);
		LOAD(memscale_dtr_tune);
	}

	if (device_mode && (!make_device_streams() || !probe_device())) {
		return 1;
	}
	if (!device_mode) {
		if (!make_sim_streams(h)) {
			return 1;
		}
	}
	test_basics();
	if (!device_mode) {
		test_made_up_stream();
	}
	test_many_pairs();
	test_record_stream_and_empty_cache();
	test_destroyed_stream();
	test_stats();
	test_snapshot_and_config();
	test_limits();
	test_bad_inputs();
	test_last_error_storage();
	test_last_error_per_thread();
	if (!skip_dtr) {
		test_dtr_allocator_usage(h);
		test_dtr_tune();
		test_dtr_status_plan_finish();
		test_dtr_region_defaults();
		test_dtr_reclaimer();
	}
	test_threads();
	test_fork();
	test_bad_config(argv[0], argv[1]);

	if (skipped) {
		printf("%d skipped (device mode, MEMSCALE_BACKEND=%s)\n", skipped, backend_env);
	}
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
