package main

/*
#include <stdlib.h>
#include "memscale_internal.h"
*/
import "C"

import (
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"unsafe"

	"go.uber.org/zap"
)

// setError records err for memscale_last_error (and counts it for
// memscale_error_count) and logs it at warn level. A nil err is ignored.
func setError(err error) {
	if err == nil {
		return
	}
	recordError(err.Error())
	if log := processLogger(); log != nil {
		log.Warn("call failed", zap.Error(err))
	}
}

// recordError stores msg as the calling thread's last error (abi.c: per
// thread, as errno; an export runs on its C caller's thread) and as the
// process's last recorded one (lastRecorded). The bytes are copied before
// the call returns, so passing Go memory is allowed.
func recordError(msg string) {
	var stored *C.char
	if msg == "" {
		stored = C.memscale_record_error(nil, 0)
	} else {
		stored = C.memscale_record_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
	}
	s := C.GoString(stored)
	lastRecorded.Store(&s)
}

// lastRecorded is the last error recorded by any thread, as stored
// (truncated as memscale_last_error returns it). Go code, the tests
// included, reads it through lastError: a goroutine may run on another OS
// thread at each cgo call, so the thread-local last error of the C side is
// only meaningful to a thread that stays put (a C caller).
var lastRecorded atomic.Pointer[string]

// lastError returns the last error recorded in the process ("" when none or
// after clearError).
func lastError() string {
	if p := lastRecorded.Load(); p != nil {
		return *p
	}
	return ""
}

// threadLastError returns what memscale_last_error returns on the calling
// OS thread (meaningful under runtime.LockOSThread).
func threadLastError() string { return C.GoString(C.memscale_last_error()) }

// errorCount returns what memscale_error_count returns now.
func errorCount() int { return int(C.memscale_error_count()) }

// guard runs fn for the export called name. An error returned by fn is
// recorded as "name: err" (so fn need not repeat the name); a panic in fn is
// recovered and recorded as "name: internal error (panic): value", with the
// stack in the log, so no Go panic ever crosses into C. guard reports whether
// fn failed either way; the export then returns its failure value (NULL, -1).
func guard(name string, fn func() error) (failed bool) {
	defer func() {
		if r := recover(); r != nil {
			failed = true
			recordError(fmt.Sprintf("%s: internal error (panic): %v", name, r))
			if log := processLogger(); log != nil {
				log.Error("panic recovered at the C boundary",
					zap.String("export", name), zap.Any("panic", r),
					zap.ByteString("stack", debug.Stack()))
			}
		}
	}()
	if err := fn(); err != nil {
		setError(fmt.Errorf("%s: %w", name, err))
		return true
	}
	return false
}

// cString returns s as a malloc'd C string that the caller of the export frees
// with memscale_string_free. A NUL byte inside s would truncate it in C; JSON
// produced by encoding/json never contains one.
func cString(s string) *C.char { return C.CString(s) }
