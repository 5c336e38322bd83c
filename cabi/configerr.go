package main

/*
#include <stdlib.h>
*/
import "C"

import "sync"

// configErr is the C copy of the configuration error, made once: the
// configuration is read once per process, so the message never changes and
// memscale_config_error can hand out static storage.
var (
	configErrOnce sync.Once
	configErr     *C.char
)

// configError returns the process's configuration error (nil when the
// environment's MEMSCALE_* configuration was accepted), reading the
// environment on the first call.
func configError() error { return loadProcess().err }

//export memscale_go_config_error
func memscale_go_config_error() (out *C.char) {
	failed := guard("memscale_config_error", func() error {
		configErrOnce.Do(func() {
			if err := configError(); err != nil {
				configErr = C.CString(err.Error()) // kept for the life of the library
			}
		})
		out = configErr
		return nil
	})
	if failed {
		return nil
	}
	return out
}

// abiConfigError calls memscale_config_error's Go export, for tests: the
// message, and whether it was NULL.
func abiConfigError() (string, bool) {
	p := memscale_go_config_error()
	if p == nil {
		return "", true
	}
	return C.GoString(p), false
}
