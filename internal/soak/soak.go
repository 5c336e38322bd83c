// Package soak sizes the long randomized differential tests (the soak):
// each test runs a short seeded slice under go test and, with
// MEMSCALE_SOAK_OPS set (make soak), as many operations as that asks for.
package soak

import (
	"fmt"
	"os"
	"strconv"
)

// EnvOps names the variable that selects the long mode: the number of
// operations the soak runs in all (make soak sets it), shared between the
// soak tests by the share each passes to Ops.
const EnvOps = "MEMSCALE_SOAK_OPS"

// Ops returns the operations a soak test runs: short when EnvOps is unset,
// else share (in (0, 1]) of its value (a whole number, 1e8 style
// accepted), at least 1. A malformed value is an error naming the variable.
func Ops(short int64, share float64) (int64, error) {
	v := os.Getenv(EnvOps)
	if v == "" {
		return short, nil
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
		return max(int64(float64(n)*share), 1), nil
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 1 && f <= 1e15 && f == float64(int64(f)) {
		return max(int64(f*share), 1), nil
	}
	return 0, fmt.Errorf("%s=%q: want a positive whole number of operations (e.g. 100000000 or 1e8)", EnvOps, v)
}

// Long reports whether the long mode was asked for.
func Long() bool { return os.Getenv(EnvOps) != "" }
