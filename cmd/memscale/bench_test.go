package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/device/cuda"
	"github.com/memscale/memscale/internal/sharedtraces"
)

// runBench runs `memscale bench ARGS` with a fake environment.
func runBench(t *testing.T, tty bool, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := benchCommand(context.Background(), args, &out, &errOut, benchEnv{
		shared: func() ([]sharedtraces.Trace, error) { return nil, os.ErrNotExist },
		isTTY:  func(io.Writer) bool { return tty },
	})
	return out.String(), errOut.String(), err
}

const mlpSample = "../../samples/snapshots/mlp-train.pickle"

func TestBenchReplayOutputs(t *testing.T) {
	dir := t.TempDir()
	csvP, jsonP, mdP, pngP := filepath.Join(dir, "r.csv"), filepath.Join(dir, "r.json"), filepath.Join(dir, "r.md"), filepath.Join(dir, "r.png")
	out, _, err := runBench(t, false, "replay", mlpSample, "--allocators", "memscale,torch", "--torch-conf", "expandable_segments:True",
		"--limit", "40MiB", "--csv", csvP, "--json", jsonP, "--markdown", mdP, "--plot", pngP)
	require.NoError(t, err)
	for _, want := range []string{"mlp-train (torch-snapshot", "memscale", "torch[expandable_segments:True]", "first OOM under limit"} {
		assert.Contains(t, out, want)
	}

	f, err := os.Open(csvP)
	require.NoError(t, err)
	rows, err := csv.NewReader(f).ReadAll()
	f.Close()
	require.NoError(t, err)
	require.Len(t, rows, 4)
	assert.Equal(t, "workload", rows[0][0])
	assert.Equal(t, []string{"memscale", "torch", "torch[expandable_segments:True]"}, []string{rows[1][2], rows[2][2], rows[3][2]})

	data, err := os.ReadFile(jsonP)
	require.NoError(t, err)
	var rep struct {
		Workloads []struct{ Name, Format string }
		Results   []struct {
			Allocator    string
			PeakReserved uint64 `json:"peak_reserved"`
			Limit        uint64
		}
	}
	require.NoError(t, json.Unmarshal(data, &rep))
	assert.Equal(t, "mlp-train", rep.Workloads[0].Name)
	assert.Equal(t, uint64(40<<20), rep.Results[0].Limit)
	assert.Greater(t, rep.Results[1].PeakReserved, uint64(0))

	md, err := os.ReadFile(mdP)
	require.NoError(t, err)
	assert.Contains(t, string(md), "### mlp-train")
	png, err := os.ReadFile(pngP)
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(png, []byte("\x89PNG")))
}

func TestBenchReplayExportRMM(t *testing.T) {
	dir := t.TempDir()
	_, _, err := runBench(t, false, "replay", "--quiet", mlpSample, "--export-rmm", dir)
	require.NoError(t, err)
	exported := filepath.Join(dir, "mlp-train.csv")
	// The exported log replays to the same peaks.
	var a, b bytes.Buffer
	outA, _, err := runBench(t, false, "replay", mlpSample, "--allocators", "torch,memscale")
	require.NoError(t, err)
	outB, _, err := runBench(t, false, "replay", exported, "--allocators", "torch,memscale")
	require.NoError(t, err)
	a.WriteString(outA)
	b.WriteString(outB)
	lineOf := func(s, prefix string) string {
		for _, l := range strings.Split(s, "\n") {
			if f := strings.Fields(l); len(f) > 4 && f[0] == prefix {
				return strings.Join(f[1:5], " ") // peaks and fragmentation
			}
		}
		return ""
	}
	for _, alloc := range []string{"torch", "memscale"} {
		assert.NotEmpty(t, lineOf(a.String(), alloc))
		assert.Equal(t, lineOf(a.String(), alloc), lineOf(b.String(), alloc), alloc)
	}
}

func TestBenchReplayQuietAndProgress(t *testing.T) {
	out, errOut, err := runBench(t, true, "replay", "--quiet", mlpSample)
	require.NoError(t, err)
	assert.Empty(t, out)
	assert.Empty(t, errOut, "no progress bar with --quiet")
}

func TestBenchReplayErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pickle")
	require.NoError(t, os.WriteFile(bad, []byte("\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00}"), 0o644))
	for _, tc := range []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"no subcommand", nil, true, "want a subcommand"},
		{"unknown subcommand", []string{"frob"}, true, `unknown subcommand "frob"`},
		{"no input", []string{"replay"}, true, "no INPUT"},
		{"unknown allocator", []string{"replay", mlpSample, "--allocators", "tcmalloc"}, true, `unknown allocator "tcmalloc"`},
		{"bad torch conf", []string{"replay", mlpSample, "--torch-conf", "max_split_size_mb:1"}, true, "must be > 20"},
		{"bad backend", []string{"replay", mlpSample, "--backend", "tpu"}, true, `--backend "tpu"`},
		{"bad limit", []string{"replay", mlpSample, "--limit", "lots"}, true, "--limit"},
		{"missing file", []string{"replay", filepath.Join(dir, "none.pickle")}, false, "none.pickle"},
		{"truncated pickle", []string{"replay", bad}, false, "truncated pickle"},
		{"bad output path", []string{"replay", mlpSample, "--csv", filepath.Join(dir, "no", "x.csv")}, false, "--csv"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runBench(t, false, tc.args...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			var ue usageError
			assert.Equal(t, tc.usage, errorsAs(err, &ue), "usage error: %v", err)
		})
	}
}

func TestBenchReplayCUDAWithoutGPU(t *testing.T) {
	if cuda.Available() == nil {
		if n, err := cuda.DeviceCount(); err == nil && n > 0 {
			t.Skip("a GPU is present")
		}
	}
	_, _, err := runBench(t, false, "replay", mlpSample, "--backend", "cuda")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--backend cuda needs an NVIDIA GPU and its driver")
}

func TestBenchHelp(t *testing.T) {
	out, _, err := runBench(t, false, "replay", "-h")
	assert.ErrorIs(t, err, errHelp())
	assert.True(t, strings.Contains(out, "usage: memscale bench replay INPUT..."), out)
	code, out2, _ := runCmd("help")
	assert.Equal(t, 0, code)
	assert.Contains(t, out2, "bench")
}

func errorsAs(err error, target *usageError) bool { return errors.As(err, target) }

func errHelp() error { return flag.ErrHelp }

func TestBenchMicro(t *testing.T) {
	dir := t.TempDir()
	csvP, jsonP := filepath.Join(dir, "m.csv"), filepath.Join(dir, "m.json")
	out, _, err := runBench(t, false, "micro", "--sizes", "512,2MiB", "--threads", "1,2", "--streams", "1", "--iterations", "20",
		"--csv", csvP, "--json", jsonP)
	require.NoError(t, err)
	assert.Contains(t, out, "C-ABI crossings, counted apart")
	assert.Contains(t, out, "malloc p50")
	f, err := os.Open(csvP)
	require.NoError(t, err)
	rows, err := csv.NewReader(f).ReadAll()
	f.Close()
	require.NoError(t, err)
	assert.Len(t, rows, 1+2*2*2*2) // sizes x threads x cached x patterns
	data, err := os.ReadFile(jsonP)
	require.NoError(t, err)
	var rep microReport
	require.NoError(t, json.Unmarshal(data, &rep))
	assert.Greater(t, rep.CToGoNs, int64(0))
	assert.Len(t, rep.Results, 16)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"micro", "--sizes", "big"}, "--sizes"},
		{[]string{"micro", "--threads", "0"}, "--threads"},
		{[]string{"micro", "--patterns", "zigzag"}, "--patterns"},
		{[]string{"micro", "--cached", "maybe"}, "--cached"},
		{[]string{"micro", "extra"}, "takes no arguments"},
	} {
		_, _, err := runBench(t, false, tc.args...)
		require.Error(t, err, tc.args)
		assert.Contains(t, err.Error(), tc.want)
	}
}

func TestBenchMicroCUDAWithoutGPU(t *testing.T) {
	if cuda.Available() == nil {
		if n, err := cuda.DeviceCount(); err == nil && n > 0 {
			t.Skip("a GPU is present")
		}
	}
	_, _, err := runBench(t, false, "micro", "--backend", "cuda")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--backend cuda needs an NVIDIA GPU")
}

// TestBenchReplayProgressBar: on a terminal, a long input gets a progress bar
// on stderr, cleared at the end; the table on stdout is unchanged.
func TestBenchReplayProgressBar(t *testing.T) {
	var b strings.Builder
	b.WriteString("Thread,Time,Action,Pointer,Size,Stream\n")
	for i := 0; i < 12000; i++ {
		fmt.Fprintf(&b, "1,%d,allocate,0x%x,%d,0x0\n1,%d,free,0x%x,%d,0x0\n", i, 0x1000+i, 512+i, i, 0x1000+i, 512+i)
	}
	p := filepath.Join(t.TempDir(), "long.csv")
	require.NoError(t, os.WriteFile(p, []byte(b.String()), 0o644))
	out, errOut, err := runBench(t, true, "replay", p, "--allocators", "torch")
	require.NoError(t, err)
	assert.Contains(t, out, "long (rmm-log, 24000 ops")
	assert.Contains(t, errOut, "long / torch", "the bar names the workload and allocator")
	_, errOut, err = runBench(t, false, "replay", p, "--allocators", "torch")
	require.NoError(t, err)
	assert.Empty(t, errOut, "no bar when stderr is not a terminal")
}
