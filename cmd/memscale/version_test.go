package main

import (
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVersion checks the version subcommand and that the Python package
// declares the same version as the header (the load-time check in
// memscale._lib refuses a library of another version).
func TestVersion(t *testing.T) {
	code, out, errOut := runCmd("version")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `^memscale \d+\.\d+\.\d+\n$`, out)

	src, err := os.ReadFile("../../pytorch_plugin/memscale/_version.py")
	require.NoError(t, err)
	m := regexp.MustCompile(`__version__\s*=\s*"([^"]+)"`).FindSubmatch(src)
	require.NotNil(t, m, "no __version__ in _version.py")
	require.Equal(t, version, string(m[1]), "cabi/memscale.h MEMSCALE_VERSION and pytorch_plugin/memscale/_version.py differ")

	code, _, errOut = runCmd("version", "extra")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "takes no arguments")
}
