/*
 * memscale_internal.h - private glue between the C entry points in abi.c and
 * the Go side of package main. Not installed; users include memscale.h.
 *
 * The memscale_go_* functions are the Go exports (defined by cgo in
 * _cgo_export.c). Every public memscale_* entry point that needs Go (the
 * allocator's and the DTR engine's memscale_dtr_*) is a C wrapper in abi.c
 * that checks the fork guard first and only then calls into Go, so a forked
 * child never enters the Go runtime. Pointers and streams cross as
 * uintptr_t so the Go side never converts integers to unsafe.Pointer.
 *
 * The Go files include this header in their cgo preamble, so the generated
 * _cgo_export.h holds these prototypes followed by cgo's own declarations of
 * the exports: any disagreement between the two is a compile error.
 */
#ifndef MEMSCALE_INTERNAL_H
#define MEMSCALE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "memscale.h" /* memscale_dtr_status */

/* The published allocated bytes per device (memscale_allocated_address),
 * written by the Go side after every malloc and free. */
#define MEMSCALE_PUBLISHED_DEVICES 64
extern int64_t memscale_published_allocated[MEMSCALE_PUBLISHED_DEVICES];

/* Go exports (cabi/alloc.go). */
extern uintptr_t memscale_go_malloc(int64_t size, int device, uintptr_t stream);
extern void memscale_go_free(uintptr_t ptr, int64_t size, int device, uintptr_t stream);
extern void memscale_go_init(int device_count);
extern void memscale_go_empty_cache(void);
extern void memscale_go_set_memory_fraction(double fraction, int device);
extern void memscale_go_record_stream(uintptr_t ptr, uintptr_t stream);
extern int memscale_go_sim_stream_create(int device, uintptr_t* stream);
extern int memscale_go_sim_stream_destroy(int device, uintptr_t stream);
extern char* memscale_go_stats_json(int device);
extern char* memscale_go_snapshot_json(void);
extern int memscale_go_reset_peak_stats(int device);
extern int memscale_go_set_threshold(int device, int64_t bytes);
extern int memscale_go_set_budget(int device, int64_t bytes);
extern int memscale_go_set_budget_slack(int device, double slack);
extern int memscale_go_step_boundary(int device);
extern int memscale_go_set_limit(int device, int64_t bytes);
extern int64_t memscale_go_allocated(int device);
extern char* memscale_go_config_json(void);
extern char* memscale_go_config_error(void);
extern int memscale_go_set_reclaimer(int device, uintptr_t fn, uintptr_t ctx);

/* Go exports (cabi/engine.go), behind the public memscale_dtr_* wrappers.
 * Strings and arrays are not const here because cgo declares *C.char and
 * *C.int64_t parameters without const; the wrappers take the public const
 * types and cast. */
extern int64_t memscale_go_dtr_create(char* config_json);
extern int memscale_go_dtr_destroy(int64_t h);
extern int memscale_go_dtr_set_budget(int64_t h, int64_t bytes);
extern int64_t memscale_go_dtr_tensor(int64_t h, int64_t nbytes, int32_t pinned);
extern int64_t memscale_go_dtr_call(int64_t h, char* name, int64_t* inputs, int32_t n_in,
                                    int64_t* out_sizes, int32_t* out_alias, int32_t n_out,
                                    int64_t cost_ns, int32_t flags, int64_t* out_ids);
extern int64_t memscale_go_dtr_op(int64_t h, char* name, int64_t* frame);
extern int64_t memscale_go_dtr_name(int64_t h, char* name);
extern int64_t memscale_go_dtr_ops(int64_t h, int64_t* frame);
extern int64_t memscale_go_dtr_mutate(int64_t h, char* name, int64_t* inputs, int32_t n_in,
                                      int32_t* mutated, int32_t n_mut, int64_t cost_ns,
                                      int32_t flags, int64_t* out_ids);
extern int memscale_go_dtr_access(int64_t h, int64_t t);
extern int memscale_go_dtr_lock(int64_t h, int64_t t);
extern int memscale_go_dtr_unlock(int64_t h, int64_t t);
extern int memscale_go_dtr_pin(int64_t h, int64_t t);
extern int memscale_go_dtr_release(int64_t h, int64_t t);
extern int32_t memscale_go_dtr_evict(int64_t h, int64_t extra, int64_t* ids, int32_t* actions,
                                     int32_t cap);
extern int32_t memscale_go_dtr_reclaim(int64_t h, int64_t need, int64_t* ids, int32_t* actions,
                                       int32_t cap);
extern int32_t memscale_go_dtr_plan(int64_t h, int64_t t, int32_t* kinds, int64_t* ids, int32_t cap);
extern int memscale_go_dtr_abandon_plans(int64_t h);
extern int memscale_go_dtr_park(int64_t h, int64_t t);
extern int memscale_go_dtr_rematerialized(int64_t h, int64_t op, int64_t cost_ns);
extern int memscale_go_dtr_swapped_in(int64_t h, int64_t t);
extern int memscale_go_dtr_finish(int64_t h);
extern memscale_dtr_status* memscale_go_dtr_status_of(int64_t h);
extern char* memscale_go_dtr_stats_json(int64_t h);
extern char* memscale_go_dtr_tune(int64_t h);

/* C helpers for the Go side (abi.c). */

/* Records msg[0:n] as the calling thread's last error, counts it, and returns
 * the message as stored (truncated past 2047 bytes). Hidden: not part of the
 * library's dynamic symbol table. */
__attribute__((visibility("hidden"))) const char* memscale_record_error(const char* msg, size_t n);
/* memscale_version, memscale_last_error, memscale_error_count and
 * memscale_clear_error, also used by the Go side, are declared in memscale.h. */

#endif /* MEMSCALE_INTERNAL_H */
