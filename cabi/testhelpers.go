package main

/*
#include <stdlib.h>
#include "memscale_internal.h"
*/
import "C"

import "unsafe"

// clearError is memscale_clear_error, for tests (test files cannot use cgo).
func clearError() { C.memscale_clear_error() }

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
