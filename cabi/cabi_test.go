package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain runs the tests on a small simulated card. With cgo, os.Setenv also
// sets libc's environment, which is what the library reads.
func TestMain(m *testing.M) {
	for k, v := range map[string]string{
		"MEMSCALE_BACKEND":      "sim",
		"MEMSCALE_SIM_CAPACITY": "1GiB",
		"MEMSCALE_LOG_LEVEL":    "error",
	} {
		if err := os.Setenv(k, v); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}

// These tests cover the Go helpers of package main in-process. The exports
// themselves are tested through the built library by tests/c/abi_test.c and
// tests/python/test_load.py.

func TestGuardRecordsErrorWithName(t *testing.T) {
	before := errorCount()
	failed := guard("memscale_test", func() error { return errors.New("something broke") })
	assert.True(t, failed)
	assert.Equal(t, before+1, errorCount())
	assert.Equal(t, "memscale_test: something broke", lastError())
}

func TestGuardSuccessRecordsNothing(t *testing.T) {
	clearError()
	before := errorCount()
	assert.False(t, guard("memscale_test", func() error { return nil }))
	assert.Equal(t, before, errorCount())
	assert.Equal(t, "", lastError())
}

func TestGuardRecoversPanics(t *testing.T) {
	tests := []struct {
		name string
		fn   func() error
		want string
	}{
		{"string panic", func() error { panic("boom") }, "memscale_test: internal error (panic): boom"},
		{"runtime error", func() error {
			var m map[string]int
			m["x"] = 1
			return nil
		}, "assignment to entry in nil map"},
		{"nil dereference", func() error {
			var p *struct{ x int }
			return errors.New(string(rune(p.x)))
		}, "nil pointer dereference"},
		{"error panic", func() error { panic(errors.New("wrapped")) }, "internal error (panic): wrapped"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := errorCount()
			failed := guard("memscale_test", tt.fn)
			assert.True(t, failed)
			assert.Equal(t, before+1, errorCount())
			assert.Contains(t, lastError(), tt.want)
		})
	}
}

func TestSetErrorNil(t *testing.T) {
	before := errorCount()
	setError(nil)
	assert.Equal(t, before, errorCount())
}

func TestLongErrorIsTruncatedAtACharacterBoundary(t *testing.T) {
	for _, unit := range []string{"x", "é", "日本", "🙂"} {
		msg := strings.Repeat(unit, 3000)
		setError(errors.New(msg))
		got := lastError()
		assert.True(t, utf8.ValidString(got), "%q: truncated in the middle of a character", unit)
		assert.True(t, strings.HasSuffix(got, " [...]"), unit)
		assert.Less(t, len(got), 2048, unit)
		assert.True(t, strings.HasPrefix(msg, strings.TrimSuffix(got, " [...]")), unit)
	}
}

func TestEmptyErrorMessage(t *testing.T) {
	setError(errors.New(""))
	assert.Equal(t, "memscale: unknown error", lastError())
}

func TestClearKeepsCount(t *testing.T) {
	setError(errors.New("e"))
	n := errorCount()
	clearError()
	assert.Equal(t, "", lastError())
	assert.Equal(t, n, errorCount())
}

// TestConcurrentErrors records errors from several goroutines at once (under
// -race this checks the Go side; the C ring is serialised by its mutex). The
// ring only promises that a returned string stays intact until 31 more
// errors are recorded, so readers here check the final message, recorded
// when nobody else writes.
func TestConcurrentErrors(t *testing.T) {
	msgs := map[string]bool{}
	for w := 0; w < 4; w++ {
		msgs[fmt.Sprintf("worker %d: %s", w, strings.Repeat(string(rune('a'+w)), 100*(w+1)))] = true
	}
	before := errorCount()
	var wg sync.WaitGroup
	for m := range msgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				setError(errors.New(m))
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, before+8000, errorCount())
	assert.True(t, msgs[lastError()], "last error %q", lastError())
}

func TestCString(t *testing.T) {
	c := cString(`{"a":1}`)
	require.NotNil(t, c)
	assert.Equal(t, `{"a":1}`, goStringAndFree(c))
}

func TestDeviceOrdinalOutOfRange(t *testing.T) {
	for _, d := range []int{-1, maxDevices, 1 << 30} {
		_, err := allocatorFor(d)
		require.Error(t, err)
		assert.ErrorIs(t, err, errDeviceRange)
	}
}

// TestHotPathDoesNotAllocate checks that a cached malloc/free pair through the
// exports allocates no Go memory (no closure, error or interface escapes).
func TestHotPathDoesNotAllocate(t *testing.T) {
	for _, size := range []int64{512, 1 << 20, 64 << 20} {
		require.True(t, mallocFreePair(size), lastError())
		allocs := testing.AllocsPerRun(1000, func() {
			if !mallocFreePair(size) {
				t.Fatal(lastError())
			}
		})
		assert.Zero(t, allocs, "size %d", size)
	}
}

func TestConfigJSONAndSnapshot(t *testing.T) {
	require.True(t, mallocFreePair(4096), lastError())
	b, err := configJSON()
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(b, &cfg))
	assert.Equal(t, "sim", cfg["backend"])
	assert.Equal(t, float64(1<<30), cfg["sim_capacity"])
	devs := cfg["devices"].([]any)
	require.Len(t, devs, 1)
	assert.Equal(t, float64(1<<30), devs[0].(map[string]any)["total_memory"])

	b, err = snapshotJSON()
	require.NoError(t, err)
	var snap struct {
		Segments     []map[string]any   `json:"segments"`
		DeviceTraces [][]map[string]any `json:"device_traces"`
	}
	require.NoError(t, json.Unmarshal(b, &snap))
	assert.NotEmpty(t, snap.Segments)
	assert.Len(t, snap.DeviceTraces, 1)
}

func TestDeviceAllocated(t *testing.T) {
	a, err := deviceAllocated(0)
	require.NoError(t, err)
	assert.Zero(t, a.Allocated())
	_, err = deviceAllocated(1) // the simulation has one device
	require.Error(t, err)
	assert.Contains(t, err.Error(), "device 1")
}

// TestPublishedAllocated: memscale_allocated_address's int64 follows every
// malloc and free of its device, and the C array covers every ordinal.
func TestPublishedAllocated(t *testing.T) {
	require.Equal(t, maxDevices, int(publishedDevices()), "MEMSCALE_PUBLISHED_DEVICES = maxDevices")
	require.True(t, mallocFreePair(512), lastError())
	p := abiMalloc(3<<20, 0, 0)
	require.NotZero(t, p, lastError())
	assert.Equal(t, abiAllocated(0), publishedAllocated(0))
	abiFree(p, 3<<20, 0, 0)
	assert.Equal(t, abiAllocated(0), publishedAllocated(0))
	assert.True(t, publishedAddressNil(-1) && publishedAddressNil(maxDevices), "out of range: NULL")
}

// TestMadeUpStreamRefused: on the sim, as on a driver, memscale_malloc and
// memscale_free refuse a handle that is not a stream of the device (nothing
// allocated or freed, an error naming the handle), and accept the default
// streams and a stream from memscale_sim_stream_create until it is destroyed.
func TestMadeUpStreamRefused(t *testing.T) {
	clearError()
	require.Zero(t, abiMalloc(4096, 0, 0xdeadbeef), "malloc on a made-up stream")
	msg := lastError()
	require.Contains(t, msg, "memscale_malloc: 4096 bytes on device 0: stream 0xdeadbeef")
	require.Contains(t, msg, "not a stream of this device")
	require.Contains(t, msg, "memscale_sim_stream_create")

	for _, s := range []uintptr{0, 1, 2} {
		p := abiMalloc(4096, 0, s)
		require.NotZero(t, p, "default stream %#x: %s", s, lastError())
		abiFree(p, 4096, 0, s)
	}
	s, rc := abiSimStreamCreate(0)
	require.Zero(t, rc, lastError())
	p := abiMalloc(4096, 0, s)
	require.NotZero(t, p, lastError())

	clearError()
	before := abiAllocated(0)
	abiFree(p, 4096, 0, 0xdeadbeef)
	require.Contains(t, lastError(), "memscale_free: pointer")
	require.Contains(t, lastError(), "(not freed): stream 0xdeadbeef")
	require.Equal(t, before, abiAllocated(0), "a free on a made-up stream freed nothing")
	clearError()
	abiFree(p, 4096, 0, s)
	require.Empty(t, lastError())
	require.Equal(t, before-4096, abiAllocated(0))

	require.Zero(t, abiSimStreamDestroy(0, s), lastError())
	require.Zero(t, abiMalloc(4096, 0, s), "malloc on a destroyed stream")
	require.Contains(t, lastError(), "not a stream of this device")
	require.Equal(t, -1, abiSimStreamDestroy(0, s), "destroyed twice")
}
