package main

/*
#include <stdlib.h>

extern char** environ;

static char* memscale_environ_at(size_t i) { return environ[i]; }
*/
import "C"

import "unsafe"

// The Go runtime of a c-shared library takes its copy of the environment from
// the process's initial environment block when the library is loaded, so
// os.Getenv does not see variables the host set with setenv/putenv before
// loading us (Python's os.environ[...] = ... before ctypes.CDLL, a C program's
// setenv before dlopen). The configuration is therefore read from libc's
// current environment.

// cLookupEnv is a config.LookupFunc over libc's environment.
func cLookupEnv(name string) (string, bool) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	v := C.getenv(cs)
	if v == nil {
		return "", false
	}
	return C.GoString(v), true
}

// cEnviron returns libc's environment as "NAME=value" strings.
func cEnviron() []string {
	var out []string
	for i := C.size_t(0); ; i++ {
		e := C.memscale_environ_at(i)
		if e == nil {
			return out
		}
		out = append(out, C.GoString(e))
	}
}
