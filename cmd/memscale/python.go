package main

// The Python commands (run, check, record) live in the memscale Python package
// (pytorch_plugin/memscale/_cli.py): they run a training script under PyTorch.
// This program lists them in its help and hands them over to
// `python -m memscale`, so `memscale run ...` works whichever entry point the
// user typed; the Python side hands the native commands back here.

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// pythonEnv names the interpreter the Python commands run on. The Python
// entry point sets it (to its own interpreter) before it hands a native
// command to this program.
const pythonEnv = "MEMSCALE_PYTHON"

// pythonCommands are the Python package's commands with their summaries
// (the same as PYTHON_COMMANDS in pytorch_plugin/memscale/_cli.py).
var pythonCommands = []struct{ name, summary string }{
	{"run", "run a training script under DTR: memscale run [--threshold SIZE] SCRIPT [ARGS...]"},
	{"check", "check a training script under DTR's stress setting (exit status 1: not safe)"},
	{"record", "record a script's allocations as a PyTorch memory snapshot (for memscale bench replay)"},
}

func init() {
	for _, c := range pythonCommands {
		name := c.name
		register(command{
			name:    name,
			summary: c.summary + " (Python)",
			run: func(args []string, stdout, stderr io.Writer) error {
				return execPython(name, args)
			},
		})
	}
}

// pythonLauncher is how to start `python -m memscale`: the interpreter and
// the extra environment (a checkout's package directory on PYTHONPATH).
type pythonLauncher struct {
	python string
	env    []string
}

// findPython chooses the interpreter: $MEMSCALE_PYTHON; else, for a program
// built in a checkout (build/memscale), the checkout's .venv and its
// pytorch_plugin; else python3 on PATH.
func findPython(self string, getenv func(string) string) (pythonLauncher, error) {
	var l pythonLauncher
	if p := getenv(pythonEnv); p != "" {
		l.python = p
	}
	repo := filepath.Dir(filepath.Dir(self)) // build/memscale -> the checkout
	if _, err := os.Stat(filepath.Join(repo, "pytorch_plugin", "memscale", "__init__.py")); err == nil {
		path := filepath.Join(repo, "pytorch_plugin")
		if old := getenv("PYTHONPATH"); old != "" {
			path += string(os.PathListSeparator) + old
		}
		l.env = append(l.env, "PYTHONPATH="+path)
		if l.python == "" {
			venv := filepath.Join(repo, ".venv", "bin", "python")
			if _, err := os.Stat(venv); err == nil {
				l.python = venv
			}
		}
	}
	if l.python == "" {
		p, err := exec.LookPath("python3")
		if err != nil {
			return l, fmt.Errorf("the %s command is the Python package's, and no Python was found: set %s to "+
				"the interpreter that has memscale and torch installed (pip install ./pytorch_plugin)", "run/check/record", pythonEnv)
		}
		l.python = p
	}
	return l, nil
}

// execPython replaces this process with `python -m memscale NAME ARGS...`.
func execPython(name string, args []string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program's path: %w", err)
	}
	l, err := findPython(self, os.Getenv)
	if err != nil {
		return err
	}
	argv := append([]string{l.python, "-m", "memscale", name}, args...)
	if err := syscall.Exec(l.python, argv, append(os.Environ(), l.env...)); err != nil {
		return fmt.Errorf("starting %s for memscale %s: %w (set %s to the interpreter that has memscale installed)",
			l.python, name, err, pythonEnv)
	}
	return nil // not reached: Exec replaced this process
}
