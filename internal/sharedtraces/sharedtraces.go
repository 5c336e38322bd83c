// Package sharedtraces locates the real DTR training traces that live beside the
// project in ../shared/traces/dtr. Tests and benchmarks read them from there and
// skip with a clear reason when the directory is absent; the traces are never
// copied into the repository.
package sharedtraces

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// EnvDir overrides the trace directory.
const EnvDir = "MEMSCALE_DTR_TRACES"

// Dir returns the directory holding the DTR traces: $MEMSCALE_DTR_TRACES if set,
// else ../shared/traces/dtr relative to the repository root.
func Dir() (string, error) {
	if d := os.Getenv(EnvDir); d != "" {
		if _, err := os.Stat(d); err != nil {
			return "", fmt.Errorf("%s=%q: %w", EnvDir, d, err)
		}
		return d, nil
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("sharedtraces: cannot locate the source tree")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..")
	d := filepath.Clean(filepath.Join(root, "..", "shared", "traces", "dtr"))
	if _, err := os.Stat(d); err != nil {
		return "", fmt.Errorf("shared DTR traces not found at %s (set %s): %w", d, EnvDir, err)
	}
	return d, nil
}

// Trace names one shared trace file.
type Trace struct {
	// Name is the model's short name ("resnet32", "tv_densenet121", ...).
	Name string
	// Path is the file's absolute path.
	Path string
}

// List returns the traces in Dir, sorted by name.
func List() ([]Trace, error) {
	d, err := Dir()
	if err != nil {
		return nil, err
	}
	matches, err := filepath.Glob(filepath.Join(d, "*.log"))
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", d, err)
	}
	out := make([]Trace, 0, len(matches))
	for _, m := range matches {
		base := filepath.Base(m)
		name := base
		if i := strings.IndexByte(base, '-'); i > 0 {
			name = base[:i]
		}
		out = append(out, Trace{Name: name, Path: m})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Skipper is the part of testing.TB that ForTest needs.
type Skipper interface {
	Helper()
	Skipf(format string, args ...any)
}

// ForTest returns the shared traces, or skips the test with the reason when
// they are not available.
func ForTest(t Skipper) []Trace {
	t.Helper()
	traces, err := List()
	if err != nil {
		t.Skipf("skipping: %v", err)
		return nil
	}
	if len(traces) == 0 {
		t.Skipf("skipping: no *.log traces in the shared trace directory")
	}
	return traces
}

// titles are the shared traces' models as the DTR paper names them, with
// the batch size in brackets.
var titles = map[string]string{
	"resnet32": "ResNet-32 (56)", "tv_densenet121": "DenseNet-121 (84)", "transformer": "Transformer (10)",
	"lstm": "LSTM (512)", "unet": "U-Net (6)",
}

// Title returns the model of a shared trace as the DTR paper names it
// ("ResNet-32 (56)"), or name itself for a trace it does not know.
func Title(name string) string {
	if t, ok := titles[name]; ok {
		return t
	}
	return name
}
