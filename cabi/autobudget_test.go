package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEngineTellsTheAllocatorItsBudget: an engine created with "usage":
// "allocator" and a budget tells the device's allocator that budget
// (budget_bytes in its statistics), memscale_dtr_set_budget updates it and
// destroying the engine withdraws it. With several, the allocator follows the
// largest of the live engines' budgets and of memscale_set_budget's value;
// engines counting their own usage, stress engines and engines without a
// budget tell it nothing.
func TestEngineTellsTheAllocatorItsBudget(t *testing.T) {
	a, err := allocatorFor(0)
	require.NoError(t, err)
	require.Equal(t, 0, abiSetBudget(0, 0), lastError())
	engines := map[string]int64{}
	t.Cleanup(func() {
		for _, h := range engines {
			abiDTRDestroy(h)
		}
		abiSetBudget(0, 0)
	})
	create := func(name, config string) func(t *testing.T) {
		return func(t *testing.T) {
			h := abiDTRCreate(config)
			require.Positive(t, h, lastError())
			engines[name] = h
		}
	}
	destroy := func(name string) func(t *testing.T) {
		return func(t *testing.T) {
			require.Equal(t, 0, abiDTRDestroy(engines[name]), lastError())
			delete(engines, name)
		}
	}
	setEngine := func(name string, bytes int64) func(t *testing.T) {
		return func(t *testing.T) {
			require.Equal(t, 0, abiDTRSetBudget(engines[name], bytes), lastError())
		}
	}
	setExplicit := func(bytes int64) func(t *testing.T) {
		return func(t *testing.T) { require.Equal(t, 0, abiSetBudget(0, bytes), lastError()) }
	}
	steps := []struct {
		name string
		do   func(t *testing.T)
		want int64 // the allocator's budget_bytes afterwards
	}{
		{"engine a (100 MiB)", create("a", `{"budget": 104857600, "usage": "allocator", "device": 0}`), 100 * mib},
		{"engine b (300 MiB): the largest", create("b", `{"budget": 314572800, "usage": "allocator", "device": 0}`), 300 * mib},
		{"b lowers its budget to 50 MiB", setEngine("b", 50*mib), 100 * mib},
		{"memscale_set_budget 200 MiB", setExplicit(200 * mib), 200 * mib},
		{"a closes", destroy("a"), 200 * mib},
		{"memscale_set_budget 0", setExplicit(0), 50 * mib},
		{"an engine counting its own usage", create("own", `{"budget": 1073741824, "usage": "engine"}`), 50 * mib},
		{"a stress engine", create("stress", `{"stress": true, "budget": 1073741824, "usage": "allocator", "device": 0}`), 50 * mib},
		{"b closes, the last with a budget", destroy("b"), 0},
		{"a measuring engine (no budget)", create("m", `{"usage": "allocator", "device": 0}`), 0},
		{"it is given a budget", setEngine("m", 70*mib), 70 * mib},
		{"its budget is removed", setEngine("m", 0), 0},
		{"given one again", setEngine("m", 80*mib), 80 * mib},
		{"it closes", destroy("m"), 0},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.do(t)
			require.Equal(t, st.want, a.Stats()["budget_bytes"])
		})
	}
}
