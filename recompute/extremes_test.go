package recompute

import (
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Sizes and costs at the int64 edges (issue 32).

func TestTraceSizesAboveTheMaximum(t *testing.T) {
	for _, c := range []struct {
		name   string
		memory int64
		ok     bool
	}{
		{"at the maximum", MaxSize, true},
		{"one above", MaxSize + 1, false},
		{"2^62", 1 << 62, false},
		{"2^63-1", math.MaxInt64, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := strconv.FormatInt(c.memory, 10)
			for _, src := range []string{
				lines(start, `{"INSTRUCTION":"CONSTANT","NAME":"w"}`, `{"INSTRUCTION":"MEMORY","NAME":"w","MEMORY":"`+m+`"}`),
				lines(start, `{"INSTRUCTION":"CONSTANT","NAME":"w"}`, `{"INSTRUCTION":"MEMORY","NAME":"w","MEMORY":"8"}`,
					`{"INSTRUCTION":"CALL","NAME":"f","ARGS":["w"],"RESULT":["a"],"TIME":"1"}`,
					`{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"`+m+`"}`, `{"INSTRUCTION":"ALIAS","NAME":"a","ALIAS":"-1"}`),
			} {
				_, err := parse(t, src)
				if c.ok {
					require.NoError(t, err)
					continue
				}
				require.Error(t, err)
				assert.Contains(t, err.Error(), m, "names the size")
				assert.Contains(t, err.Error(), "281474976710656", "names the limit")
			}
		})
	}
}

func TestGraphSizeLimits(t *testing.T) {
	for _, c := range []struct {
		name string
		size uint64
		ok   bool
	}{{"zero", 0, true}, {"max", MaxSize, true}, {"above", MaxSize + 1, false}, {"2^62", 1 << 62, false}, {"max uint64", math.MaxUint64, false}} {
		t.Run(c.name, func(t *testing.T) {
			g := NewGraph()
			_, err := g.AddExternal(c.size, 1)
			x, err2 := g.AddExternal(8, 1)
			require.NoError(t, err2)
			_, err3 := g.AddOp("f", []TensorID{x}, []OutSpec{{Size: c.size, Alias: -1}}, 1, 0, 2)
			if c.ok {
				require.NoError(t, err)
				require.NoError(t, err3)
				assert.Equal(t, 2*c.size+8, g.LiveBytes())
				return
			}
			require.ErrorIs(t, err, ErrTooLarge)
			require.ErrorIs(t, err3, ErrTooLarge)
			assert.Equal(t, uint64(8), g.LiveBytes(), "nothing refused counts")
			assert.Equal(t, 1, g.NumStorages())
			assert.Equal(t, 0, g.NumOps())
		})
	}
	// the live limit, then a release makes room again
	g := NewGraph()
	var last TensorID
	for range MaxLiveBytes / MaxSize {
		var err error
		last, err = g.AddExternal(MaxSize, 1)
		require.NoError(t, err)
	}
	_, err := g.AddExternal(1, 1)
	require.ErrorIs(t, err, ErrTooLarge)
	g.Release(g.Tensor(last).Storage)
	_, err = g.AddExternal(1, 1)
	require.NoError(t, err)
	assert.Equal(t, uint64(MaxLiveBytes-MaxSize+1), g.LiveBytes())
}

func TestComputeSaturates(t *testing.T) {
	g := NewGraph()
	x, err := g.AddExternal(8, 1)
	require.NoError(t, err)
	// two ops write views of one storage: its Compute sums both costs
	op, err := g.AddOp("f", []TensorID{x}, []OutSpec{{Size: 8, Alias: -1}}, math.MaxInt64, 0, 2)
	require.NoError(t, err)
	y := g.Op(op).Outputs[0]
	_, err = g.AddOp("view", []TensorID{y}, []OutSpec{{Alias: 0}}, math.MaxInt64, 0, 3)
	require.NoError(t, err)
	assert.Equal(t, int64(math.MaxInt64), g.StorageOf(y).Compute)
}

func TestClassCostsExactAtTheEdges(t *testing.T) {
	var c Classes
	a := c.New(math.MaxInt64)
	b := c.New(math.MaxInt64)
	d := c.New(5)
	r := c.Union(c.Union(a, b), d)
	assert.Equal(t, int64(math.MaxInt64), c.Cost(r), "clamped, not wrapped")
	c.Add(a, -math.MaxInt64)
	assert.Equal(t, int64(math.MaxInt64), c.Cost(r))
	c.Add(b, -math.MaxInt64)
	assert.Equal(t, int64(5), c.Cost(r), "members leave exactly what they brought")
}
