/*
 * memscale_internal.h - private glue between the C entry points in abi.c and
 * the Go side of package main. Not installed; users include memscale.h.
 *
 * The memscale_go_* functions are the Go exports (defined by cgo in
 * _cgo_export.c). Every public memscale_* allocator entry point is a C wrapper
 * in abi.c that checks the fork guard first and only then calls into Go, so a
 * forked child never enters the Go runtime. Pointers and streams cross as
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

/* Go exports (cabi/alloc.go). */
extern uintptr_t memscale_go_malloc(int64_t size, int device, uintptr_t stream);
extern void memscale_go_free(uintptr_t ptr, int64_t size, int device, uintptr_t stream);
extern void memscale_go_init(int device_count);
extern void memscale_go_empty_cache(void);
extern void memscale_go_set_memory_fraction(double fraction, int device);
extern void memscale_go_record_stream(uintptr_t ptr, uintptr_t stream);
extern char* memscale_go_stats_json(int device);
extern char* memscale_go_snapshot_json(void);
extern int memscale_go_reset_peak_stats(int device);
extern int memscale_go_set_threshold(int device, int64_t bytes);
extern int memscale_go_set_limit(int device, int64_t bytes);
extern int64_t memscale_go_allocated(int device);
extern char* memscale_go_config_json(void);

/* C helpers for the Go side (abi.c). */

/* Records msg[0:n] as the last error and counts it. Hidden: not part of the
 * library's dynamic symbol table. */
__attribute__((visibility("hidden"))) void memscale_record_error(const char* msg, size_t n);
/* Also public (memscale.h); declared here for the Go side. */
const char* memscale_version(void);
const char* memscale_last_error(void);
int memscale_error_count(void);
void memscale_clear_error(void);

#endif /* MEMSCALE_INTERNAL_H */
