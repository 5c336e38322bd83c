package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/device/cuda"
)

// runCmd runs a command line and returns the exit status and outputs.
func runCmd(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestDispatch(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantOut    []string
		wantErrOut []string
	}{
		{name: "no arguments", args: nil, wantCode: 2, wantErrOut: []string{"usage: memscale <command>", "info"}},
		{name: "help", args: []string{"help"}, wantCode: 0, wantOut: []string{"commands:", "help", "info", "show GPUs"}},
		{name: "--help", args: []string{"--help"}, wantCode: 0, wantOut: []string{"commands:"}},
		{name: "help info", args: []string{"help", "info"}, wantCode: 0, wantOut: []string{"usage: memscale info [--json]", "-json"}},
		{name: "help unknown", args: []string{"help", "frobnicate"}, wantCode: 2, wantErrOut: []string{`unknown command "frobnicate"`}},
		{name: "unknown", args: []string{"frobnicate"}, wantCode: 2, wantErrOut: []string{`memscale: error: unknown command "frobnicate" (known: bench, check, help, info, plan, record, replay, run, version; see 'memscale --help')`}},
		{name: "info -h", args: []string{"info", "-h"}, wantCode: 0, wantOut: []string{"usage: memscale info"}},
		{name: "info bad flag", args: []string{"info", "--yaml"}, wantCode: 2, wantErrOut: []string{"memscale: error: info: info: flag provided but not defined: -yaml"}},
		{name: "info extra argument", args: []string{"info", "gpu0"}, wantCode: 2, wantErrOut: []string{`info takes no arguments, got ["gpu0"]`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCmd(tc.args...)
			assert.Equal(t, tc.wantCode, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
			for _, w := range tc.wantOut {
				assert.Contains(t, out, w)
			}
			for _, w := range tc.wantErrOut {
				assert.Contains(t, errOut, w)
			}
		})
	}
}

func TestFinish(t *testing.T) {
	var buf bytes.Buffer
	assert.Equal(t, 1, finish("x", errors.New("boom"), &buf))
	assert.Equal(t, "memscale: error: x: boom\n", buf.String())
}

// TestInfoWithoutDriver runs `memscale info` for real on a machine without an
// NVIDIA driver: it must say so and exit 0.
func TestInfoWithoutDriver(t *testing.T) {
	if cuda.Available() == nil {
		t.Skip("a CUDA driver is present; this test covers machines without one")
	}
	t.Setenv("MEMSCALE_BACKEND", "")
	t.Setenv("MEMSCALE_SIM_CAPACITY", "")
	code, out, errOut := runCmd("info")
	require.Equal(t, 0, code, "stderr: %s", errOut)
	t.Logf("memscale info:\n%s", out)
	assert.Contains(t, out, "NVML: not present: nvml.Init: ERROR_")
	assert.Contains(t, out, "CUDA driver: not present: cuda: dlopen libcuda.so.1")
	assert.Contains(t, out, "backend auto: sim (CUDA not usable:")
	assert.Contains(t, out, "MEMSCALE_BACKEND=(unset = auto): sim")
	assert.Contains(t, out, "sim: capacity 16.0 GiB, granularity 2.0 MiB, copy bandwidth instant")

	code, out, errOut = runCmd("info", "--json")
	require.Equal(t, 0, code, "stderr: %s", errOut)
	var r infoReport
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	assert.False(t, r.NVML.Present)
	assert.NotEmpty(t, r.NVML.Error)
	assert.False(t, r.CUDA.Present)
	assert.Equal(t, "sim", r.Backend.Auto)
	assert.Equal(t, uint64(16<<30), r.Sim.Capacity)

	t.Setenv("MEMSCALE_BACKEND", "cuda")
	code, out, _ = runCmd("info")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "MEMSCALE_BACKEND=cuda: error: backend cuda requested but unavailable")
}

func TestInfoReportFormatting(t *testing.T) {
	report := infoReport{
		NVML: nvmlInfo{Present: true, DriverVersion: "550.54.15", Devices: []gpuInfo{
			{Index: 0, Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 << 30, MemoryUsed: 1 << 30, MemoryFree: 79 << 30, PCIeGen: 5, PCIeWidth: 16},
			{Index: 1, Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 << 30, Errors: []string{"GetCurrPcieLinkGeneration: Not Supported"}},
		}},
		CUDA:    cudaInfo{Present: true, DriverVersion: 12040, Devices: 2},
		Backend: backendInfo{Env: "sim", Auto: "cuda", Selected: "sim"},
		Sim:     simInfo{Capacity: 16 << 30, Granularity: 2 << 20, CopyBandwidth: 25e9, CapacityEnv: "24GiB"},
	}
	probe := func() infoReport { return report }
	var out bytes.Buffer
	require.NoError(t, infoCommand(nil, &out, probe))
	want := `NVML: driver 550.54.15, 2 GPU(s)
GPU 0: NVIDIA H100 80GB HBM3
  memory: total 80.0 GiB, used 1.0 GiB, free 79.0 GiB
  PCIe link: gen 5 x16
GPU 1: NVIDIA H100 80GB HBM3
  memory: total 80.0 GiB, used 0 B, free 0 B
  error: GetCurrPcieLinkGeneration: Not Supported
CUDA driver: version 12.4, 2 device(s)
backend auto: cuda
MEMSCALE_BACKEND=sim: sim
sim: capacity 16.0 GiB, granularity 2.0 MiB, copy bandwidth 23.3 GiB/s (defaults; MEMSCALE_SIM_CAPACITY=24GiB applies in libmemscale)
`
	assert.Equal(t, want, out.String())

	out.Reset()
	require.NoError(t, infoCommand([]string{"--json"}, &out, probe))
	var back infoReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &back))
	assert.Equal(t, report, back)

	assert.Error(t, infoCommand(nil, failingWriter{}, probe))
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

func TestBytesHuman(t *testing.T) {
	tests := []struct {
		n    uint64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{2 << 20, "2.0 MiB"},
		{16 << 30, "16.0 GiB"},
		{3 << 40, "3.0 TiB"},
		{5 << 50, "5.0 PiB"},
		{1 << 62, "4096.0 PiB"},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, bytesHuman(tc.n), "%d", tc.n)
	}
}
