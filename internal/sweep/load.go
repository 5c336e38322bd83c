package sweep

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/memscale/memscale/internal/sharedtraces"
	rc "github.com/memscale/memscale/recompute"
)

// AllShared is the trace argument that stands for every shared trace.
const AllShared = "all-shared"

// Input is one trace to sweep.
type Input struct {
	// Name is the short name used in tables, plots and file names.
	Name string
	// Path is the trace file.
	Path string
	// Trace, when set, is the parsed trace (Path is then only reported);
	// otherwise Run parses Path.
	Trace *rc.Trace
}

// SharedLister lists the shared traces (sharedtraces.List in production).
type SharedLister func() ([]sharedtraces.Trace, error)

// Resolve turns trace arguments into inputs. An argument is, in this order:
// the path of an existing file; AllShared (every shared trace); the name of a
// shared trace ("unet"), or a part of one that matches a single trace
// ("densenet"). The same file named twice is swept once. Names are made
// unique by appending "-2", "-3", ... An argument that is none of these is an
// error naming it.
func Resolve(args []string, shared SharedLister) ([]Input, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("no trace given")
	}
	var (
		out      []Input
		seen     = map[string]bool{}
		names    = map[string]int{}
		list     []sharedtraces.Trace
		listErr  error
		listDone bool
	)
	sharedList := func() ([]sharedtraces.Trace, error) {
		if !listDone {
			listDone = true
			if shared == nil {
				listErr = fmt.Errorf("no shared traces configured")
			} else {
				list, listErr = shared()
			}
		}
		return list, listErr
	}
	add := func(name, path string) {
		key := path
		if abs, err := filepath.Abs(path); err == nil {
			key = abs
		}
		if seen[key] {
			return
		}
		seen[key] = true
		names[name]++
		if n := names[name]; n > 1 {
			name = fmt.Sprintf("%s-%d", name, n)
		}
		out = append(out, Input{Name: name, Path: path})
	}
	for _, a := range args {
		if a == "" {
			return nil, fmt.Errorf("empty trace argument")
		}
		if st, err := os.Stat(a); err == nil {
			if st.IsDir() {
				return nil, fmt.Errorf("trace %s: is a directory", a)
			}
			add(stem(a), a)
			continue
		}
		if a == AllShared {
			l, err := sharedList()
			if err != nil {
				return nil, fmt.Errorf("trace %s: %w", a, err)
			}
			if len(l) == 0 {
				return nil, fmt.Errorf("trace %s: no shared traces found", a)
			}
			for _, t := range l {
				add(t.Name, t.Path)
			}
			continue
		}
		t, err := findShared(a, sharedList)
		if err != nil {
			return nil, err
		}
		add(t.Name, t.Path)
	}
	return out, nil
}

// findShared looks up a shared trace by exact name or unique substring.
func findShared(arg string, list func() ([]sharedtraces.Trace, error)) (sharedtraces.Trace, error) {
	l, err := list()
	if err != nil {
		return sharedtraces.Trace{}, fmt.Errorf("trace %q: no such file, and the shared traces are unavailable: %w", arg, err)
	}
	var match []sharedtraces.Trace
	for _, t := range l {
		if t.Name == arg {
			return t, nil
		}
		if strings.Contains(t.Name, arg) {
			match = append(match, t)
		}
	}
	if len(match) == 1 {
		return match[0], nil
	}
	known := make([]string, len(l))
	for i, t := range l {
		known[i] = t.Name
	}
	sort.Strings(known)
	if len(match) > 1 {
		return sharedtraces.Trace{}, fmt.Errorf("trace %q: ambiguous shared trace name (shared: %s)", arg, strings.Join(known, ", "))
	}
	return sharedtraces.Trace{}, fmt.Errorf("trace %q: no such file and no shared trace of that name (shared: %s, or %s)",
		arg, strings.Join(known, ", "), AllShared)
}

// stem is a file's base name without .gz and .log.
func stem(path string) string {
	b := filepath.Base(path)
	b = strings.TrimSuffix(b, ".gz")
	b = strings.TrimSuffix(b, ".log")
	if b == "" {
		return "trace"
	}
	return b
}
