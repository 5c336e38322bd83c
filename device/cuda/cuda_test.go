package cuda

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/allocator"
	"github.com/memscale/memscale/device"
)

// envFake names the fake-driver scenario a child test process runs.
const envFake = "MEMSCALE_TEST_FAKECUDA"

const mib = 1 << 20

// TestNoDriver checks the clean failure on a machine without a CUDA driver.
func TestNoDriver(t *testing.T) {
	if os.Getenv(envFake) != "" {
		t.Skip("running a fake-driver scenario")
	}
	if err := Available(); err == nil {
		t.Skip("a CUDA driver is present; this test covers machines without one")
	}
	tests := []struct {
		name string
		call func() error
	}{
		{name: "Available", call: Available},
		{name: "DeviceCount", call: func() error { _, err := DeviceCount(); return err }},
		{name: "DriverVersion", call: func() error { _, err := DriverVersion(); return err }},
		{name: "Open", call: func() error { _, err := Open(0); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.ErrorIs(t, err, device.ErrUnavailable)
			assert.Contains(t, err.Error(), "cuda: ")
			if _, statErr := os.Stat("/dev/nvidiactl"); statErr != nil {
				assert.Contains(t, err.Error(), Library, "without a driver the error names the library")
			}
		})
	}
	_, err := Open(-1)
	require.Error(t, err)
	assert.NotErrorIs(t, err, device.ErrUnavailable)
	assert.Contains(t, err.Error(), "ordinal -1 is negative")
}

// TestOnGPU runs on a machine with a real driver and device.
func TestOnGPU(t *testing.T) {
	if os.Getenv(envFake) != "" {
		t.Skip("running a fake-driver scenario")
	}
	if err := Available(); err != nil {
		t.Skipf("needs a CUDA driver: %v", err)
	}
	n, err := DeviceCount()
	require.NoError(t, err)
	if n == 0 {
		t.Skip("needs a CUDA device: the driver reports none")
	}
	exercise(t, "", 0)
}

// exercise runs every Device method on device ordinal. Expectations that only
// hold on the fake driver are checked when fake is set.
func exercise(t *testing.T, fake string, ordinal int) {
	d, err := Open(ordinal)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	info := d.Info()
	t.Logf("device %d: %+v", ordinal, info)
	assert.Equal(t, "cuda", info.Backend)
	assert.Equal(t, ordinal, info.Ordinal)
	assert.NotEmpty(t, info.Name)
	assert.NotZero(t, info.TotalMemory)
	assert.NotZero(t, info.Granularity)

	free, total, err := d.MemInfo()
	require.NoError(t, err)
	assert.LessOrEqual(t, free, total)

	g := info.Granularity
	host, err := d.AllocHost(2 * g)
	require.NoError(t, err)
	hb := hostSlice(host, 2*g)
	for i := range hb {
		hb[i] = byte(i * 13)
	}
	want := bytes.Clone(hb)

	if info.VMM {
		base, err := d.ReserveAddress(4 * g)
		require.NoError(t, err)
		assert.Zero(t, uint64(base)%g, "reservation aligned to the granularity")
		h, err := d.CreatePhysical(2 * g)
		require.NoError(t, err)
		require.NoError(t, d.Map(base+device.Ptr(g), 2*g, h))
		require.NoError(t, d.CopyToDevice(base+device.Ptr(g), host, 2*g, 0))
		clear(hb)
		require.NoError(t, d.CopyToHost(host, base+device.Ptr(g), 2*g, 0))
		assert.Equal(t, want, hb)
		require.NoError(t, d.Unmap(base+device.Ptr(g), 2*g))
		require.NoError(t, d.ReleasePhysical(h))
		require.NoError(t, d.FreeAddress(base, 4*g))

		_, err = d.ReserveAddress(g + 1)
		require.ErrorContains(t, err, "not a positive multiple of the granularity")
		_, err = d.CreatePhysical(0)
		require.ErrorContains(t, err, "not a positive multiple of the granularity")
		require.ErrorContains(t, d.Map(base, 100, h), "not a positive multiple of the granularity")

		// More than the card holds.
		huge := (total/g + 1) * g
		_, err = d.CreatePhysical(huge)
		var oom *device.OutOfMemoryError
		require.ErrorAs(t, err, &oom)
		assert.ErrorIs(t, err, device.ErrOutOfMemory)
		assert.Equal(t, "CreatePhysical", oom.Op)
		assert.Equal(t, huge, oom.Requested)
		var cerr *Error
		require.ErrorAs(t, err, &cerr)
		assert.Equal(t, "cuMemCreate", cerr.Call)
		assert.Equal(t, ErrorOutOfMemory, cerr.Code)
		assert.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", cerr.Name)
	}

	p, err := d.Alloc(1000)
	require.NoError(t, err)
	require.NoError(t, d.CopyToDevice(p, host, 1000, 0))
	clear(hb[:1000])
	require.NoError(t, d.CopyToHost(host, p, 1000, 0))
	assert.Equal(t, want[:1000], hb[:1000])
	require.NoError(t, d.Free(p))
	_, err = d.Alloc(0)
	require.ErrorContains(t, err, "size is 0")
	_, err = d.Alloc(total + g)
	var oom *device.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	assert.Equal(t, "Alloc", oom.Op)
	require.ErrorContains(t, err, "cuMemAlloc_v2")

	e, err := d.CreateEvent()
	require.NoError(t, err)
	require.NoError(t, d.RecordEvent(e, 0))
	require.NoError(t, d.SynchronizeEvent(e))
	done, err := d.QueryEvent(e)
	require.NoError(t, err)
	assert.True(t, done)
	require.NoError(t, d.DestroyEvent(e))
	require.NoError(t, d.Synchronize())
	require.NoError(t, d.FreeHost(host))

	if fake != "" {
		free2, _, err := d.MemInfo()
		require.NoError(t, err)
		assert.Equal(t, free, free2, "everything given back")
	}
}

// TestFakeDriver builds the fake libcuda.so.1 in testdata and runs the
// scenarios against it in child processes (the driver is loaded once per
// process).
func TestFakeDriver(t *testing.T) {
	if os.Getenv(envFake) != "" {
		t.Skip("running a fake-driver scenario")
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("needs gcc to build the fake driver")
	}
	dir := t.TempDir()
	lib := filepath.Join(dir, "libcuda.so.1")
	out, err := exec.Command(gcc, "-Wall", "-Werror", "-shared", "-fPIC", "-o", lib, filepath.Join("testdata", "fakecuda", "fakecuda.c")).CombinedOutput()
	require.NoError(t, err, "building the fake driver: %s", out)

	for _, scenario := range []string{"normal", "initfail", "nodevices", "novmm", "wrongctx", "streams", "nopeer", "growth"} {
		t.Run(scenario, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestFakeChild$", "-test.count=1", "-test.v")
			counts := filepath.Join(t.TempDir(), "counts")
			cmd.Env = append(os.Environ(), envFake+"="+scenario, "LD_LIBRARY_PATH="+dir, "FAKECUDA_COUNTS="+counts)
			switch scenario {
			case "nopeer":
				cmd.Env = append(cmd.Env, "FAKECUDA_NO_PEER=1")
			case "growth":
				cmd.Env = append(cmd.Env, "FAKECUDA_MEMORY="+strconv.Itoa(4<<30))
			case "initfail":
				cmd.Env = append(cmd.Env, "FAKECUDA_INIT_ERROR=100")
			case "nodevices":
				cmd.Env = append(cmd.Env, "FAKECUDA_DEVICES=0")
			case "novmm":
				cmd.Env = append(cmd.Env, "FAKECUDA_NO_VMM=1")
			}
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "child output:\n%s", out)
			require.Contains(t, string(out), "--- PASS: TestFakeChild", "child output:\n%s", out)
			if want, ok := wantCounts[scenario]; ok {
				got := readCounts(t, counts)
				for name, n := range want {
					assert.Equal(t, n, got[name], "%s calls in scenario %s (all: %v)", name, scenario, got)
				}
			}
		})
	}
}

// wantCounts are the driver calls the fake counted in a scenario.
var wantCounts = map[string]map[string]int{
	// 1 GiB in one allocation, freed, cache emptied: 512 granules created,
	// mapped and released, but access set once and unmapped once.
	"growth":  {"cuMemCreate": 512, "cuMemMap": 512, "cuMemSetAccess": 1, "cuMemUnmap": 1, "cuMemRelease": 512, "invalid_handle": 0},
	"streams": {"cuStreamCreate": 2, "cuStreamDestroy": 2},
}

// readCounts reads the "name count" lines the fake writes at exit.
func readCounts(t *testing.T, path string) map[string]int {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err, "the fake driver writes its counts at exit")
	got := make(map[string]int)
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		require.Len(t, f, 2, "count line %q", line)
		n, err := strconv.Atoi(f[1])
		require.NoError(t, err)
		got[f[0]] = n
	}
	return got
}

// TestFakeChild is the child side of TestFakeDriver.
func TestFakeChild(t *testing.T) {
	scenario := os.Getenv(envFake)
	if scenario == "" {
		t.Skip("only run by TestFakeDriver")
	}
	switch scenario {
	case "normal":
		require.NoError(t, Available())
		v, err := DriverVersion()
		require.NoError(t, err)
		assert.Equal(t, 12040, v)
		n, err := DeviceCount()
		require.NoError(t, err)
		require.Equal(t, 2, n)
		_, err = Open(2)
		require.ErrorContains(t, err, "device ordinal 2 out of range: 2 device(s) present (0..1)")
		assert.NotErrorIs(t, err, device.ErrUnavailable)
		exercise(t, scenario, 0)
		exercise(t, scenario, 1)

		d, err := Open(1)
		require.NoError(t, err)
		info := d.Info()
		assert.Equal(t, "Fake GPU 1", info.Name)
		assert.Equal(t, uint64(128*mib), info.TotalMemory)
		assert.Equal(t, uint64(2*mib), info.Granularity)
		assert.True(t, info.VMM)

		// Event on a stream whose work never finishes: not ready, not an error.
		e, err := d.CreateEvent()
		require.NoError(t, err)
		require.NoError(t, d.RecordEvent(e, 0x77))
		done, err := d.QueryEvent(e)
		require.NoError(t, err)
		assert.False(t, done)
		err = d.SynchronizeEvent(e)
		require.ErrorContains(t, err, "cuda: SynchronizeEvent on device 1: cuEventSynchronize: CUDA_ERROR_INVALID_VALUE (1): invalid argument")
		var cerr *Error
		require.ErrorAs(t, err, &cerr)
		require.NoError(t, d.DestroyEvent(e))
		err = d.CopyToHost(0x1000, 0x2000, 0, 0x77)
		require.NoError(t, err, "zero-byte copies do nothing")

		require.NoError(t, d.Close())
		require.NoError(t, d.Close(), "Close is idempotent")
		_, _, err = d.MemInfo()
		require.ErrorContains(t, err, "device closed")
		_, err = d.Alloc(1)
		require.ErrorContains(t, err, "device closed")

	case "wrongctx":
		// The calling thread's current context is restored after each call,
		// and the device's own context is current during it.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		d0, err := Open(0)
		require.NoError(t, err)
		d1, err := Open(1)
		require.NoError(t, err)
		cur, err := currentContext()
		require.NoError(t, err)
		require.Zero(t, cur, "fresh thread has no context")

		_, total, err := d1.MemInfo()
		require.NoError(t, err)
		assert.Equal(t, uint64(128*mib), total, "device 1's context was current during the call")
		cur, err = currentContext()
		require.NoError(t, err)
		assert.Zero(t, cur, "no context left current behind")

		require.NoError(t, setCurrentContext(d0.context()))
		_, total, err = d1.MemInfo()
		require.NoError(t, err)
		assert.Equal(t, uint64(128*mib), total)
		cur, err = currentContext()
		require.NoError(t, err)
		assert.Equal(t, d0.context(), cur, "the caller's context is restored")
		_, total, err = d0.MemInfo()
		require.NoError(t, err)
		assert.Equal(t, uint64(64*mib), total)

		// Map sets access for its own device: the fake checks location.id
		// against the current context.
		b, err := d1.ReserveAddress(2 * mib)
		require.NoError(t, err)
		h, err := d1.CreatePhysical(2 * mib)
		require.NoError(t, err)
		require.NoError(t, d1.Map(b, 2*mib, h))
		require.NoError(t, d1.Unmap(b, 2*mib))
		require.NoError(t, d1.ReleasePhysical(h))
		require.NoError(t, d1.FreeAddress(b, 2*mib))
		require.NoError(t, setCurrentContext(0))
		require.NoError(t, d0.Close())
		require.NoError(t, d1.Close())

	case "streams":
		d0, err := Open(0)
		require.NoError(t, err)
		d1, err := Open(1)
		require.NoError(t, err)
		assert.Equal(t, []int{1}, d0.Info().Peers, "device 1 can access device 0's memory")
		s0, err := d0.createStream()
		require.NoError(t, err)
		s1, err := d1.createStream()
		require.NoError(t, err)
		for _, s := range []device.Stream{0, 1, 2, s0} {
			require.NoError(t, d0.CheckStream(s), "stream %#x is device 0's", uintptr(s))
		}
		err = d0.CheckStream(s1)
		require.ErrorContains(t, err, "belongs to another CUDA context, not device 0's primary context")
		e, err := d0.CreateEvent()
		require.NoError(t, err)
		require.NoError(t, d0.RecordEvent(e, s0))
		// Made-up handles, as abi_test once passed, are what a real driver refuses.
		for _, bad := range []device.Stream{0x5a5a, 0x1000} {
			require.ErrorContains(t, d0.RecordEvent(e, bad), "CUDA_ERROR_INVALID_HANDLE", "stream %#x", uintptr(bad))
			require.ErrorContains(t, d0.CheckStream(bad), "not a valid stream")
		}
		require.ErrorContains(t, d0.RecordEvent(e, s1), "CUDA_ERROR_INVALID_HANDLE", "another context's stream")
		require.NoError(t, d0.destroyStream(s0))
		require.ErrorContains(t, d0.RecordEvent(e, s0), "CUDA_ERROR_INVALID_HANDLE", "a destroyed stream")
		require.NoError(t, d1.destroyStream(s1))
		require.NoError(t, d0.DestroyEvent(e))
		// Access for the peer is granted with the mapping.
		b, err := d0.ReserveAddress(4 * mib)
		require.NoError(t, err)
		h0, err := d0.CreatePhysical(2 * mib)
		require.NoError(t, err)
		h1, err := d0.CreatePhysical(2 * mib)
		require.NoError(t, err)
		require.NoError(t, d0.MapRange(b, 2*mib, []device.Handle{h0, h1}))
		require.ErrorContains(t, d0.Map(b, 2*mib, h0), "cuMemMap", "mapped twice")
		require.ErrorContains(t, d0.Unmap(b, 2*mib+2*mib/2), "Unmap", "part of a mapping")
		require.NoError(t, d0.Unmap(b, 4*mib), "two mappings unmapped in one call")
		require.NoError(t, d0.ReleasePhysical(h0))
		require.NoError(t, d0.ReleasePhysical(h1))
		require.NoError(t, d0.FreeAddress(b, 4*mib))
		require.NoError(t, d0.Close())
		require.NoError(t, d1.Close())

	case "nopeer":
		d, err := Open(0)
		require.NoError(t, err)
		assert.Empty(t, d.Info().Peers)
		exercise(t, scenario, 0)
		require.NoError(t, d.Close())

	case "growth":
		d, err := Open(0)
		require.NoError(t, err)
		a, err := allocator.New(allocator.Config{Device: d})
		require.NoError(t, err)
		p, err := a.Malloc(1<<30, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
		require.NoError(t, a.EmptyCache())
		require.NoError(t, a.Close())
		require.NoError(t, d.Close())

	case "initfail":
		for _, err := range []error{Available(), errOf(DeviceCount()), errOf(Open(0))} {
			require.ErrorIs(t, err, device.ErrUnavailable)
			assert.Contains(t, err.Error(), "cuda: cuInit: CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected")
			var cerr *Error
			require.ErrorAs(t, err, &cerr)
			assert.Equal(t, 100, cerr.Code)
		}

	case "nodevices":
		n, err := DeviceCount()
		require.NoError(t, err)
		assert.Zero(t, n)
		_, err = Open(0)
		require.ErrorIs(t, err, device.ErrUnavailable)
		assert.Contains(t, err.Error(), "no CUDA devices")

	case "novmm":
		d, err := Open(0)
		require.NoError(t, err)
		info := d.Info()
		assert.False(t, info.VMM)
		assert.Equal(t, uint64(defaultGranularity), info.Granularity)
		for name, call := range map[string]func() error{
			"ReserveAddress":  func() error { _, err := d.ReserveAddress(2 * mib); return err },
			"FreeAddress":     func() error { return d.FreeAddress(0, 2*mib) },
			"CreatePhysical":  func() error { _, err := d.CreatePhysical(2 * mib); return err },
			"ReleasePhysical": func() error { return d.ReleasePhysical(1) },
			"Map":             func() error { return d.Map(0, 2*mib, 1) },
			"Unmap":           func() error { return d.Unmap(0, 2*mib) },
		} {
			err := call()
			require.Error(t, err, name)
			assert.Contains(t, err.Error(), "virtual memory management is not supported", name)
		}
		exercise(t, scenario, 1)
		require.NoError(t, d.Close())

	default:
		t.Fatalf("unknown scenario %q", scenario)
	}
}

// hostSlice views n bytes of driver-allocated host memory at p.
func hostSlice(p uintptr, n uint64) []byte {
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), n)
}

func errOf[T any](_ T, err error) error { return err }

// TestCSharedLoadsWithoutDriver builds a c-shared library containing this
// package and loads it with RTLD_NOW, as ctypes and PyTorch do: it must have no
// undefined symbols beyond libc/libdl, and report the missing driver cleanly.
func TestCSharedLoadsWithoutDriver(t *testing.T) {
	if os.Getenv(envFake) != "" {
		t.Skip("running a fake-driver scenario")
	}
	if testing.Short() {
		t.Skip("builds a c-shared library (~10 s); skipped with -short")
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("needs gcc")
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	dir := t.TempDir()
	lib := filepath.Join(dir, "libprobe.so")
	build := exec.Command(goTool, "build", "-buildmode=c-shared", "-o", lib, "./testdata/cshared")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build -buildmode=c-shared: %s", out)

	if nm, err := exec.LookPath("nm"); err == nil {
		out, err := exec.Command(nm, "-D", "--undefined-only", lib).CombinedOutput()
		require.NoError(t, err, "%s", out)
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line)
			if len(f) != 2 || f[0] != "U" {
				continue // weak symbols may stay undefined
			}
			assert.Contains(t, f[1], "@GLIBC", "undefined symbol %s not from glibc", f[1])
			assert.False(t, strings.HasPrefix(f[1], "cu"), "CUDA symbol %s linked directly", f[1])
		}
	}

	loader := filepath.Join(dir, "load")
	out, err = exec.Command(gcc, "-o", loader, filepath.Join("testdata", "cshared", "load.c"), "-ldl").CombinedOutput()
	require.NoError(t, err, "%s", out)
	cmd := exec.Command(loader, lib)
	cmd.Env = append(os.Environ(), "LD_BIND_NOW=1")
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "loading with RTLD_NOW: %s", out)
	if Available() != nil {
		assert.Contains(t, string(out), "device backend unavailable", "probe output: %s", out)
	}
	t.Logf("probe: %s", bytes.TrimSpace(out))
}

func TestErrorFormat(t *testing.T) {
	tests := []struct {
		e    Error
		want string
	}{
		{e: Error{Call: "cuMemCreate", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Description: "out of memory"}, want: "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory"},
		{e: Error{Call: "cuInit", Code: 999}, want: "cuInit: CUresult (999)"},
		{e: Error{Call: "cuInit", Code: 100, Name: "CUDA_ERROR_NO_DEVICE"}, want: "cuInit: CUDA_ERROR_NO_DEVICE (100)"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.e.Error())
			var target *Error
			assert.True(t, errors.As(error(&tc.e), &target))
		})
	}
}
