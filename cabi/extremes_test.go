package main

import (
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLastErrorIsPerThread: issue 32 found memscale_last_error process-wide
// (two threads x 200k failing calls read the other thread's message hundreds
// of times). Two goroutines locked to their OS threads, as two C threads are,
// record errors naming themselves and read the thread's last error after
// each: it is always their own.
func TestLastErrorIsPerThread(t *testing.T) {
	const n = 20000
	var wg sync.WaitGroup
	wrong := make([]int, 2)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			me := fmt.Sprintf("thread %d", w)
			for i := range n {
				setError(fmt.Errorf("%s: failure %d", me, i))
				if got := threadLastError(); !strings.HasPrefix(got, me+":") {
					wrong[w]++
				}
			}
			// the ring keeps the last 8 of this thread intact
			clearError()
			if threadLastError() != "" {
				wrong[w]++
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, []int{0, 0}, wrong, "reads of the other thread's message")
}

func TestConfigErrorNilWhenAccepted(t *testing.T) {
	// the test process's configuration (TestMain) is valid
	msg, isNil := abiConfigError()
	assert.True(t, isNil, "memscale_config_error: %q", msg)
}

// TestDTRTensorSizes: four memscale_dtr_tensor(2^62) left usage 0 and a
// negative peak (issue 32). Sizes above the maximum are refused, naming the
// size and the limit, and usage stays exact.
func TestDTRTensorSizes(t *testing.T) {
	h := abiDTRCreate(`{"budget": 1073741824, "usage": "engine"}`)
	require.Positive(t, h, lastError())
	defer abiDTRDestroy(h)
	for _, n := range []int64{1 << 62, 1<<48 + 1, math.MaxInt64} {
		require.Equal(t, int64(-1), abiDTRTensor(h, n, 0))
		assert.Contains(t, lastError(), fmt.Sprint(n))
		assert.Contains(t, lastError(), "281474976710656", "names the limit")
	}
	x := abiDTRTensor(h, 1000, 0)
	require.GreaterOrEqual(t, x, int64(0), lastError())
	var st struct {
		Usage     uint64 `json:"usage"`
		PeakUsage uint64 `json:"peak_usage"`
	}
	require.NoError(t, json.Unmarshal([]byte(abiDTRStatsJSON(h)), &st))
	assert.Equal(t, uint64(1000), st.Usage)
	assert.Equal(t, uint64(1000), st.PeakUsage)
}

// TestDTRHugeCostsTerminate: op costs near 2^63 made memscale_dtr_evict and
// memscale_dtr_tune spin (issue 32). Both return, and the stats show no
// wrapped counter.
func TestDTRHugeCostsTerminate(t *testing.T) {
	for _, cost := range []int64{math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 / 2} {
		h := abiDTRCreate(`{"budget": 4000, "heuristic": "auto", "usage": "engine"}`)
		require.Positive(t, h, lastError())
		w := abiDTRTensor(h, 100, 1)
		require.GreaterOrEqual(t, w, int64(0), lastError())
		x := w
		for range 12 {
			require.Equal(t, 0, abiDTRLock(h, x), lastError())
			n, _ := abiDTREvict(h, 1000, 16)
			require.GreaterOrEqual(t, n, int32(0), lastError())
			op, outs := abiDTRCall(h, []int64{x}, []int64{1000}, []int32{-1}, cost, 0)
			require.GreaterOrEqual(t, op, int64(0), lastError())
			require.Equal(t, 0, abiDTRUnlock(h, x), lastError())
			x = outs[0]
		}
		var st struct {
			BaseCostNS int64 `json:"base_cost_ns"`
			Clock      int64 `json:"clock"`
			Evictions  int64 `json:"evictions"`
		}
		require.NoError(t, json.Unmarshal([]byte(abiDTRStatsJSON(h)), &st))
		assert.Equal(t, int64(math.MaxInt64), st.BaseCostNS, "saturated, not wrapped")
		assert.Equal(t, int64(math.MaxInt64), st.Clock)
		assert.Positive(t, st.Evictions)
		js := abiDTRTune(h)
		require.NotEmpty(t, js, lastError())
		require.Equal(t, 0, abiDTRDestroy(h), lastError())
	}
}

// TestDTRFactorsThatOverflowAreRefused: MEMSCALE_RECOMP_*_FACTOR=110 made
// every score NaN (issue 32); the engine's configuration refuses them.
func TestDTRFactorsThatOverflowAreRefused(t *testing.T) {
	for _, cfg := range []string{`{"recomp_time_factor": 110}`, `{"recomp_memory_factor": 8.5}`} {
		require.Equal(t, int64(-1), abiDTRCreate(cfg), cfg)
		assert.Contains(t, lastError(), "to 8", cfg)
	}
	h := abiDTRCreate(`{"recomp_time_factor": 8, "recomp_memory_factor": 8}`)
	require.Positive(t, h, lastError())
	require.Equal(t, 0, abiDTRDestroy(h))
}
