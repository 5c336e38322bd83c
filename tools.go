//go:build tools

// Package tools pins module dependencies that are used only by some build
// configurations, so that `go mod tidy` keeps them.
package tools

import (
	_ "github.com/NVIDIA/go-nvml/pkg/nvml"
	_ "github.com/google/btree"
	_ "github.com/stretchr/testify/require"
	_ "go.uber.org/zap"
	_ "gonum.org/v1/plot"
)
