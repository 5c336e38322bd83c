package micro

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/device"
	"github.com/memscale/memscale/device/sim"
)

func simDevice() (device.Device, error) { return sim.New(sim.Config{Capacity: 8 << 30}) }

func TestGrid(t *testing.T) {
	var o Options
	cells := o.Grid()
	// 8 sizes x 3 thread counts x 2 stream counts x cached/uncached x 2 patterns.
	assert.Len(t, cells, 8*3*2*2*2)
	assert.Equal(t, uint64(512), DefaultSizes[0])
	assert.Equal(t, uint64(1<<30), DefaultSizes[len(DefaultSizes)-1])
}

func TestRunSmallGrid(t *testing.T) {
	o := Options{
		Sizes: []uint64{512, 3 << 20}, Threads: []int{1, 4}, Streams: []int{1, 4},
		Iterations: 50, NewDevice: simDevice, MaxLive: 64 << 20,
	}
	var seen int
	o.Progress = func(done, total int, _ Cell) { seen = done; assert.Equal(t, 32, total) }
	res, err := Run(context.Background(), o)
	require.NoError(t, err)
	require.Len(t, res, 32)
	assert.Equal(t, 32, seen)
	for _, r := range res {
		assert.Empty(t, r.Error, "%+v", r.Cell)
		assert.Greater(t, r.Ops, 0, "%+v", r.Cell)
		assert.LessOrEqual(t, r.P50, r.P99)
		assert.LessOrEqual(t, r.P99, r.Max)
		if r.Pattern == Pairs {
			iters := 50
			if !r.Cached {
				iters = 10
			}
			assert.Equal(t, 2*iters*r.Threads, r.Ops, "%+v", r.Cell)
		}
	}
}

func TestDeviceError(t *testing.T) {
	r := RunCell(Options{NewDevice: func() (device.Device, error) { return nil, assert.AnError }}, Cell{Size: 512, Threads: 1, Streams: 1, Pattern: Pairs})
	assert.Contains(t, r.Error, assert.AnError.Error())
}

func TestCrossingCost(t *testing.T) {
	g2c, c2g := CrossingCost(1000)
	assert.Greater(t, g2c, time.Duration(0))
	assert.Greater(t, c2g, time.Duration(0))
}
