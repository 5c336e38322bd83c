// Command cshared is built by the package cuda tests with -buildmode=c-shared
// to check that a shared library containing package cuda loads with immediate
// binding on a machine without a CUDA driver.
package main

import "C"

import "github.com/memscale/memscale/device/cuda"

// probe reports cuda.Available() as a C string ("ok" or the error).
//
//export probe
func probe() *C.char {
	if err := cuda.Available(); err != nil {
		return C.CString(err.Error())
	}
	return C.CString("ok")
}

func main() {}
