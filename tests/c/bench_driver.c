// bench_driver.c - times cached malloc+free pairs through the C ABI of
// libmemscale.so, exactly as PyTorch calls it (same signatures, through
// function pointers obtained with dlsym).
//
//   gcc -O2 -Wall -Wextra -o build/bench_driver tests/c/bench_driver.c -ldl
//   build/bench_driver build/libmemscale.so [samples] [min_ms_per_sample]
//
// For each size the pair is warmed up (so the block is cached), then timed in
// samples of many iterations (clock_gettime(CLOCK_MONOTONIC) around each
// sample, default 101 samples of >= 2 ms, interleaved across the rows); the
// table shows the median, minimum and 90th percentile of the per-pair wall
// time over the samples, and the median per-pair CPU time of the calling
// thread (CLOCK_THREAD_CPUTIME_ID), which stays meaningful when other
// processes compete for the cores. One more row times memscale_allocated(0),
// a single C->Go call that does almost nothing, as the floor of any export.
// Runs on MEMSCALE_BACKEND=sim unless MEMSCALE_BACKEND is already set.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../cabi/memscale.h" /* the public header, relative to this file */

static __typeof__(&memscale_malloc) p_malloc;
static __typeof__(&memscale_free) p_free;
static __typeof__(&memscale_allocated) p_allocated;
static __typeof__(&memscale_last_error) p_last_error;
static __typeof__(&memscale_error_count) p_error_count;

static double now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

// cpu_ns is the CPU time of the calling thread: unlike wall time it does not
// grow while the thread waits for a core another process is using.
static double cpu_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void* a, const void* b) {
	double x = *(const double*)a, y = *(const double*)b;
	return (x > y) - (x < y);
}

// run_pairs does n malloc+free pairs of size bytes; returns 0 on failure.
static int run_pairs(int64_t size, long n) {
	cudaStream_t s = (cudaStream_t)0;
	for (long i = 0; i < n; i++) {
		void* p = p_malloc(size, 0, s);
		if (__builtin_expect(p == NULL, 0)) {
			return 0;
		}
		p_free(p, size, 0, s);
	}
	return 1;
}

static int run_calls(int64_t unused, long n) {
	(void)unused;
	int64_t sum = 0;
	for (long i = 0; i < n; i++) {
		sum += p_allocated(0);
	}
	return sum >= 0;
}

struct result {
	double median, min, p90, cpu_median;
	long iters;
};

// calibrate returns an iteration count for which fn takes at least min_ms,
// judged on the fastest of three runs so that a run slowed down by another
// process does not pick too small a count.
static long calibrate(int (*fn)(int64_t, long), int64_t size, double min_ms) {
	long iters = 1000;
	for (;;) {
		double best = 1e300;
		for (int k = 0; k < 3; k++) {
			double t0 = now_ns();
			if (!fn(size, iters)) {
				return 0;
			}
			double dt = now_ns() - t0;
			best = dt < best ? dt : best;
		}
		if (best >= min_ms * 1e6 || iters >= (1L << 30)) {
			return iters;
		}
		iters *= 2;
	}
}

static void summarize(double* per, double* cpu, int samples, long iters, struct result* r) {
	qsort(per, (size_t)samples, sizeof *per, cmp_double);
	qsort(cpu, (size_t)samples, sizeof *cpu, cmp_double);
	r->median = per[samples / 2];
	r->min = per[0];
	r->p90 = per[(samples * 9) / 10];
	r->cpu_median = cpu[samples / 2];
	r->iters = iters;
}

int main(int argc, char** argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: %s path/to/libmemscale.so [samples (>= 21)] [min_ms_per_sample]\n", argv[0]);
		return 2;
	}
	int samples = argc > 2 ? atoi(argv[2]) : 101;
	double min_ms = argc > 3 ? atof(argv[3]) : 2;
	if (samples < 21) {
		fprintf(stderr, "samples must be >= 21\n");
		return 2;
	}
	setenv("MEMSCALE_BACKEND", "sim", 0);
	setenv("MEMSCALE_SIM_CAPACITY", "4GiB", 0);

	void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		fprintf(stderr, "dlopen(%s): %s\n", argv[1], dlerror());
		return 1;
	}
	p_malloc = (__typeof__(p_malloc))dlsym(h, "memscale_malloc");
	p_free = (__typeof__(p_free))dlsym(h, "memscale_free");
	p_allocated = (__typeof__(p_allocated))dlsym(h, "memscale_allocated");
	p_last_error = (__typeof__(p_last_error))dlsym(h, "memscale_last_error");
	p_error_count = (__typeof__(p_error_count))dlsym(h, "memscale_error_count");
	if (!p_malloc || !p_free || !p_allocated || !p_last_error || !p_error_count) {
		fprintf(stderr, "dlsym: missing export\n");
		return 1;
	}

	static const struct {
		const char* name;
		int64_t size;
	} sizes[] = {
	    {"512 B", 512}, {"64 KiB", 64 << 10}, {"1 MiB", 1 << 20}, {"16 MiB", 16 << 20}, {"256 MiB", 256 << 20},
	};
	printf("memscale C ABI: cached malloc+free pair, %d samples, >= %.1f ms each\n\n", samples, min_ms);
	printf("| %-34s | %11s | %9s | %9s | %14s | %12s |\n", "operation", "median ns", "min ns", "p90 ns",
	       "median CPU ns", "iters/sample");
	printf("|%s|%s|%s|%s|%s|%s|\n", "------------------------------------", "------------:", "----------:",
	       "----------:", "---------------:", "-------------:");
	int errors = p_error_count();
	enum { NOPS = 6 };
	const char* labels[NOPS];
	long iters[NOPS];
	double* per[NOPS];
	double* cpu[NOPS];
	for (int op = 0; op < NOPS; op++) {
		int (*fn)(int64_t, long) = op < 5 ? run_pairs : run_calls;
		int64_t size = op < 5 ? sizes[op].size : 0;
		// Warm up: caches the block, attaches this thread to the Go runtime.
		if (!fn(size, 1000) || (iters[op] = calibrate(fn, size, min_ms)) == 0) {
			fprintf(stderr, "op %d failed: %s\n", op, p_last_error());
			return 1;
		}
		per[op] = calloc((size_t)samples, sizeof(double));
		cpu[op] = calloc((size_t)samples, sizeof(double));
	}
	// Samples are interleaved across the operations, so that interference
	// from other processes spreads over all rows instead of spoiling one.
	for (int i = 0; i < samples; i++) {
		for (int op = 0; op < NOPS; op++) {
			int (*fn)(int64_t, long) = op < 5 ? run_pairs : run_calls;
			int64_t size = op < 5 ? sizes[op].size : 0;
			double c0 = cpu_ns();
			double t0 = now_ns();
			if (!fn(size, iters[op])) {
				fprintf(stderr, "op %d failed: %s\n", op, p_last_error());
				return 1;
			}
			double t1 = now_ns();
			per[op][i] = (t1 - t0) / (double)iters[op];
			cpu[op][i] = (cpu_ns() - c0) / (double)iters[op];
		}
	}
	char names[NOPS][64];
	for (int op = 0; op < NOPS; op++) {
		if (op < 5) {
			snprintf(names[op], sizeof names[op], "malloc+free %s", sizes[op].name);
		} else {
			snprintf(names[op], sizeof names[op], "memscale_allocated (1 C->Go call)");
		}
		labels[op] = names[op];
		struct result r;
		summarize(per[op], cpu[op], samples, iters[op], &r);
		printf("| %-34s | %11.1f | %9.1f | %9.1f | %14.1f | %12ld |\n", labels[op], r.median, r.min, r.p90,
		       r.cpu_median, r.iters);
		free(per[op]);
		free(cpu[op]);
	}
	if (p_error_count() != errors) {
		fprintf(stderr, "errors during the benchmark: %s\n", p_last_error());
		return 1;
	}
	return 0;
}
