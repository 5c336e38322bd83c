package backend

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/memscale/memscale/device"
	"github.com/memscale/memscale/device/cuda"
	"github.com/memscale/memscale/device/sim"
)

// envFake names the fake-driver scenario a child test process runs.
const envFake = "MEMSCALE_TEST_FAKECUDA"

var smallSim = sim.Config{Capacity: 8 << 20}

func TestOpenWithoutDriver(t *testing.T) {
	if os.Getenv(envFake) != "" {
		t.Skip("running a fake-driver scenario")
	}
	if cuda.Available() == nil {
		t.Skip("a CUDA driver is present; this test covers machines without one")
	}
	tests := []struct {
		name        string
		backend     string
		ordinal     int
		wantErr     string
		unavailable bool
		wantLogs    int
	}{
		{name: "empty is auto", backend: "", wantLogs: 1},
		{name: "auto falls back", backend: "auto", wantLogs: 1},
		{name: "sim", backend: "sim"},
		{name: "cuda without driver", backend: "cuda", wantErr: "backend cuda requested but unavailable: cuda: dlopen libcuda.so.1", unavailable: true},
		{name: "unknown", backend: "gpu", wantErr: `backend "gpu": unknown backend; accepted values: auto, cuda, sim`},
		{name: "case matters", backend: "SIM", wantErr: `backend "SIM": unknown backend`},
		{name: "sim ordinal 1", backend: "sim", ordinal: 1, wantErr: "device ordinal 1 out of range: the simulation has one device"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.DebugLevel)
			d, err := Open(tc.backend, tc.ordinal, smallSim, zap.New(core))
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.Equal(t, tc.unavailable, isUnavailable(err))
				return
			}
			require.NoError(t, err)
			defer func() { require.NoError(t, d.Close()) }()
			info := d.Info()
			assert.Equal(t, "sim", info.Backend)
			assert.Equal(t, smallSim.Capacity, info.TotalMemory)
			require.Equal(t, tc.wantLogs, logs.Len())
			if tc.wantLogs > 0 {
				e := logs.All()[0]
				assert.Equal(t, zapcore.InfoLevel, e.Level)
				assert.Contains(t, e.Message, "using the host-memory simulation")
				assert.Contains(t, e.ContextMap()["reason"], "libcuda.so.1")
			}
		})
	}
	_, err := Open("sim", 0, sim.Config{Granularity: 123}, nil)
	require.ErrorContains(t, err, "backend sim: sim: Granularity 123")
}

func TestDeviceCountWithoutDriver(t *testing.T) {
	if os.Getenv(envFake) != "" {
		t.Skip("running a fake-driver scenario")
	}
	if cuda.Available() == nil {
		t.Skip("a CUDA driver is present; this test covers machines without one")
	}
	tests := []struct {
		name    string
		want    int
		wantErr string
	}{
		{name: "", want: 1},
		{name: "auto", want: 1},
		{name: "sim", want: 1},
		{name: "cuda", wantErr: "unavailable"},
		{name: "metal", wantErr: "accepted values: auto, cuda, sim"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, err := DeviceCount(tc.name)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, n)
		})
	}
}

func TestChoose(t *testing.T) {
	if os.Getenv(envFake) != "" {
		t.Skip("running a fake-driver scenario")
	}
	c, err := Choose("sim")
	require.NoError(t, err)
	assert.Equal(t, Choice{Requested: "sim", Backend: "sim"}, c)
	c, err = Choose("")
	require.NoError(t, err)
	assert.Equal(t, "auto", c.Requested)
	if cuda.Available() != nil {
		assert.Equal(t, "sim", c.Backend)
		assert.Contains(t, c.Fallback, "libcuda.so.1")
	} else {
		assert.Contains(t, []string{"sim", "cuda"}, c.Backend)
	}
}

// TestWithFakeDriver runs the selection against the fake driver of
// device/cuda/testdata in child processes.
func TestWithFakeDriver(t *testing.T) {
	if os.Getenv(envFake) != "" {
		t.Skip("running a fake-driver scenario")
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("needs gcc to build the fake driver")
	}
	dir := t.TempDir()
	out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", filepath.Join(dir, "libcuda.so.1"),
		filepath.Join("..", "cuda", "testdata", "fakecuda", "fakecuda.c")).CombinedOutput()
	require.NoError(t, err, "building the fake driver: %s", out)
	for _, scenario := range []string{"twodevices", "nodevices"} {
		t.Run(scenario, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestFakeChild$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), envFake+"="+scenario, "LD_LIBRARY_PATH="+dir)
			if scenario == "nodevices" {
				cmd.Env = append(cmd.Env, "FAKECUDA_DEVICES=0")
			}
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "child output:\n%s", out)
			require.Contains(t, string(out), "--- PASS: TestFakeChild", "child output:\n%s", out)
		})
	}
}

// TestFakeChild is the child side of TestWithFakeDriver.
func TestFakeChild(t *testing.T) {
	scenario := os.Getenv(envFake)
	if scenario == "" {
		t.Skip("only run by TestWithFakeDriver")
	}
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	switch scenario {
	case "twodevices":
		for _, name := range []string{"auto", "cuda"} {
			n, err := DeviceCount(name)
			require.NoError(t, err)
			assert.Equal(t, 2, n)
			d, err := Open(name, 1, smallSim, log)
			require.NoError(t, err)
			assert.Equal(t, "cuda", d.Info().Backend)
			assert.Equal(t, 1, d.Info().Ordinal)
			require.NoError(t, d.Close())
			_, err = Open(name, 2, smallSim, log)
			require.ErrorContains(t, err, "backend cuda: cuda: Open: device ordinal 2 out of range")
		}
		assert.Zero(t, logs.Len(), "no fallback, nothing logged")
		n, err := DeviceCount("sim")
		require.NoError(t, err)
		assert.Equal(t, 1, n)
	case "nodevices":
		d, err := Open("auto", 0, smallSim, log)
		require.NoError(t, err)
		assert.Equal(t, "sim", d.Info().Backend)
		require.NoError(t, d.Close())
		require.Equal(t, 1, logs.Len())
		assert.Contains(t, logs.All()[0].ContextMap()["reason"], "the driver reports no CUDA devices")
		_, err = Open("cuda", 0, smallSim, log)
		require.ErrorIs(t, err, device.ErrUnavailable)
		require.ErrorContains(t, err, "backend cuda requested but unavailable: cuda: the driver reports no CUDA devices")
	default:
		t.Fatalf("unknown scenario %q", scenario)
	}
}

func isUnavailable(err error) bool { return errors.Is(err, device.ErrUnavailable) }
