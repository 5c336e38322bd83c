package main

// The version is cabi/memscale.h's MEMSCALE_VERSION, the one version number of
// the library, this command and the Python package.

// #cgo CFLAGS: -I${SRCDIR}/../../cabi
// #include "memscale.h"
// static const char* memscale_header_version(void) { return MEMSCALE_VERSION; }
import "C"

import (
	"fmt"
	"io"
)

// version is the memscale version this command was built from.
var version = C.GoString(C.memscale_header_version())

func init() {
	register(command{
		name:    "version",
		summary: "print the memscale version",
		run: func(args []string, stdout, stderr io.Writer) error {
			if len(args) > 0 {
				return usagef("memscale version takes no arguments")
			}
			_, err := fmt.Fprintf(stdout, "memscale %s\n", version)
			return err
		},
	})
}
