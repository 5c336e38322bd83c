package main

import (
	"context"
	"io"
)

// benchMicro runs `memscale bench micro`.
func benchMicro(ctx context.Context, args []string, stdout, stderr io.Writer, env benchEnv) error {
	return usagef("bench micro: not implemented yet")
}
