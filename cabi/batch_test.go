package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/evict"
)

// TestDTROpsIsOpPerRecord: a batch of records leaves the engine exactly as
// the same ops through memscale_dtr_op one by one do - the same ids, the same
// storages freed, the same statistics - and the status block's next ids are
// the ones the records must expect.
func TestDTROpsIsOpPerRecord(t *testing.T) {
	const config = `{"budget": 100000, "heuristic": "lru"}`
	f := newDTROpFrame()
	defer f.free()
	one := newTestEngine(t, config)
	batch := newTestEngine(t, config)
	for _, h := range []int64{one, batch} {
		require.Equal(t, int64(0), abiDTRTensor(h, 100, 1))
	}
	// One by one: a, then b from a, then c (2 outputs, one an alias of b)
	// with a released before it, then a release of c's outputs.
	_, a, _ := abiDTROp(f, one, nil, []int64{0}, []int64{1000}, []int64{-1}, 10, 0, 8)
	_, b, _ := abiDTROp(f, one, nil, []int64{a[0]}, []int64{1000}, []int64{-1}, 10, 0, 8)
	_, c, freedOne := abiDTROp(f, one, []int64{a[0]}, []int64{b[0]}, []int64{1000, 8}, []int64{-1, 0}, 10, 0, 8)
	_, _, _ = abiDTROp(f, one, []int64{c[1], c[0]}, nil, nil, nil, 0, 0, 0)
	require.Equal(t, [][2]int64{{a[0], int64(evict.Drop)}}, freedOne)
	_, want := abiDTRStatus(one)

	_, st := abiDTRStatus(batch)
	name := abiDTRName(batch, "fuzz_op")
	require.Equal(t, int64(0), name, lastError())
	require.Equal(t, name, abiDTRName(batch, "fuzz_op"), "the same id for the same name")
	op, next := st.NextOp, st.NextTensor
	records := []dtrRecord{
		{name: name, inputs: []int64{0}, sizes: []int64{1000}, alias: []int64{-1}, cost: 10, op: op, firstOut: next},
		{name: name, inputs: []int64{next}, sizes: []int64{1000}, alias: []int64{-1}, cost: 10, op: op + 1, firstOut: next + 1},
		{name: name, released: []int64{next}, inputs: []int64{next + 1}, sizes: []int64{1000, 8}, alias: []int64{-1, 0},
			cost: 10, op: op + 2, firstOut: next + 2},
		{released: []int64{next + 3, next + 2}},
	}
	n, freed := abiDTROps(batch, records, 8)
	require.Equal(t, int64(4), n, lastError())
	assert.Equal(t, []int64{a[0], b[0], c[0], c[1]}, []int64{next, next + 1, next + 2, next + 3})
	// The batch hands out at its end what one by one was handed out by the
	// op after the release, and what the last release freed.
	assert.Equal(t, [][2]int64{{a[0], int64(evict.Drop)}, {c[0], int64(evict.Drop)}}, freed)
	_, got := abiDTRStatus(batch)
	want.Pending = 0 // handed out above
	assert.Equal(t, want, got)
	assert.Equal(t, op+3, got.NextOp)
	assert.Equal(t, next+4, got.NextTensor)
	assert.JSONEq(t, abiDTRStatsJSON(one), abiDTRStatsJSON(batch))
}

func TestDTROpsRejectsWhatItCannotApply(t *testing.T) {
	h := newTestEngine(t, `{"budget": 100000, "heuristic": "lru"}`)
	x := abiDTRTensor(h, 100, 1)
	name := abiDTRName(h, "op")
	_, st := abiDTRStatus(h)
	good := dtrRecord{name: name, inputs: []int64{x}, sizes: []int64{1000}, alias: []int64{-1}, cost: 1,
		op: st.NextOp, firstOut: st.NextTensor}
	cases := []struct {
		name    string
		records []dtrRecord
		want    string
	}{
		{"wrong op id", []dtrRecord{func() dtrRecord { r := good; r.op++; return r }()},
			"record 0 of 1: op op would be op 0 with first output 1; the caller expected op 1, first output 1"},
		{"wrong first output", []dtrRecord{func() dtrRecord { r := good; r.firstOut = 7; return r }()},
			"the caller expected op 0, first output 7"},
		{"unknown name", []dtrRecord{func() dtrRecord { r := good; r.name = 5; return r }()},
			"record 0 of 1: name id 5: want one memscale_dtr_name returned (0..0)"},
		{"unknown input", []dtrRecord{func() dtrRecord { r := good; r.inputs = []int64{99}; return r }()},
			"record 0 of 1: op op: evict"},
		{"negative cost", []dtrRecord{func() dtrRecord { r := good; r.cost = -1; return r }()},
			"cost_ns -1: want >= 0"},
		{"releases only with ids", []dtrRecord{{released: []int64{}, op: 3}},
			"a record of releases only (n_in -1) must have n_out and the expected ids 0"},
		{"releases only with outputs", []dtrRecord{{released: []int64{}, sizes: []int64{8}, alias: []int64{-1}}},
			"a record of releases only (n_in -1) must have n_out and the expected ids 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clearError()
			n, _ := abiDTROps(h, tc.records, 0)
			assert.Equal(t, int64(-1), n)
			assert.Contains(t, lastError(), "memscale_dtr_ops: ")
			assert.Contains(t, lastError(), tc.want)
		})
	}
	assert.Equal(t, int64(-1), abiDTROpsNoFrame(h))
	assert.Contains(t, lastError(), "frame: NULL")
	assert.Equal(t, int64(-1), abiDTRName(h, ""))
	assert.Contains(t, lastError(), "name: NULL")
	n, _ := abiDTROps(h, nil, -1)
	assert.Equal(t, int64(-1), n)
	assert.Contains(t, lastError(), "frame[1] = -1 handed-out slots")
	// An empty batch is fine, and the good record still applies.
	n, _ = abiDTROps(h, nil, 0)
	assert.Equal(t, int64(0), n, lastError())
	n, _ = abiDTROps(h, []dtrRecord{good}, 0)
	assert.Equal(t, int64(1), n, lastError())
}
