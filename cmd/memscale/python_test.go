package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFindPython(t *testing.T) {
	checkout := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(checkout, "pytorch_plugin", "memscale"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(checkout, "pytorch_plugin", "memscale", "__init__.py"), nil, 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(checkout, ".venv", "bin"), 0o755))
	venv := filepath.Join(checkout, ".venv", "bin", "python")
	require.NoError(t, os.WriteFile(venv, nil, 0o755))
	self := filepath.Join(checkout, "build", "memscale")
	elsewhere := filepath.Join(t.TempDir(), "bin", "memscale")

	tests := []struct {
		name       string
		self       string
		env        map[string]string
		wantPython string
		wantPath   string
	}{
		{"checkout: its venv and its package", self, nil, venv, filepath.Join(checkout, "pytorch_plugin")},
		{"checkout: PYTHONPATH kept after the package", self, map[string]string{"PYTHONPATH": "/x"}, venv,
			filepath.Join(checkout, "pytorch_plugin") + string(os.PathListSeparator) + "/x"},
		{"MEMSCALE_PYTHON wins", self, map[string]string{pythonEnv: "/opt/py"}, "/opt/py", filepath.Join(checkout, "pytorch_plugin")},
		{"installed: the interpreter that handed over", elsewhere, map[string]string{pythonEnv: "/opt/py"}, "/opt/py", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := findPython(tc.self, func(k string) string { return tc.env[k] })
			require.NoError(t, err)
			require.Equal(t, tc.wantPython, l.python)
			if tc.wantPath == "" {
				require.Empty(t, l.env)
			} else {
				require.Equal(t, []string{"PYTHONPATH=" + tc.wantPath}, l.env)
			}
		})
	}
}

func TestHelpListsThePythonCommands(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, run([]string{"--help"}, &out, &errb))
	for _, c := range pythonCommands {
		require.True(t, strings.Contains(out.String(), "  "+c.name+" "), "help lacks %s:\n%s", c.name, out.String())
	}
	for _, native := range []string{"replay", "bench", "info", "version"} {
		require.Contains(t, out.String(), "  "+native+" ")
	}
}
