package replay

import (
	"testing"

	"github.com/memscale/memscale/evict"
	rc "github.com/memscale/memscale/recompute"
)

// parkTrace is a step whose last op reads p and q, both evicted by a large
// temporary: q's rebuild re-runs Q1 (200 bytes, released by the program)
// and then Q, and while Q runs p (rebuilt first, 100 bytes, locked as the
// op's first input) is in the way. The op itself needs x + p + q + its
// output: 308 bytes; the rebuild of q with p resident needs 408.
func parkTrace(t *testing.T, pFirst bool) *rc.Trace {
	t.Helper()
	var b rc.Builder
	must := func(ids []int32, err error) []int32 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	fresh := func(n uint64) []rc.OutSpec { return []rc.OutSpec{{Size: n, Alias: -1}} }
	x := b.Constant(8)
	q1 := must(b.Call("Q1", []int32{x}, fresh(200), 1000))[0]
	q := must(b.Call("Q", []int32{q1}, fresh(100), 1000))[0]
	if err := b.Release(q1); err != nil {
		t.Fatal(err)
	}
	p := must(b.Call("P", []int32{x}, fresh(100), 1000))[0]
	tmp := must(b.Call("T", []int32{x}, fresh(250), 1000))[0]
	if err := b.Release(tmp); err != nil {
		t.Fatal(err)
	}
	args := []int32{p, q}
	if !pFirst {
		args = []int32{q, p}
	}
	out := must(b.Call("Z", args, fresh(100), 1000))[0]
	for _, r := range []int32{p, q, x} {
		if err := b.Release(r); err != nil {
			t.Fatal(err)
		}
	}
	_ = out
	return b.Trace()
}

// TestRegionParksOuterLevels: at a budget the region runs the step at, the
// replay of Options.Plans runs out of room (p stays locked while q's plan
// runs) and Options.Region finishes, parking p while Q runs and bringing it
// back before Z reads it, as the region's rebuild does. Without parking the
// region replay fails too, and with q first (nothing held while it is
// rebuilt) both finish.
func TestRegionParksOuterLevels(t *testing.T) {
	for _, tc := range []struct {
		name           string
		pFirst, park   bool
		plans, region  Status
		parkedAtLeast1 bool
	}{
		{"p first, parking", true, true, OOM, OK, true},
		{"p first, no parking", true, false, OOM, OOM, false},
		{"q first, parking", false, true, OK, OK, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := parkTrace(t, tc.pFirst)
			cfg := evict.Config{Park: tc.park}
			for _, region := range []bool{false, true} {
				res, err := Run(tr, Options{Budget: 320, Engine: cfg, OverheadLimit: -1, Plans: true, Region: region, Check: true})
				if err != nil {
					t.Fatalf("region=%v: %v", region, err)
				}
				want := tc.plans
				if region {
					want = tc.region
				}
				if res.Status != want {
					t.Fatalf("region=%v: status %s (%s), want %s", region, res.Status, res.Reason, want)
				}
				if res.Peak > 320 {
					t.Fatalf("region=%v: peak %d over the budget 320", region, res.Peak)
				}
				if region && tc.parkedAtLeast1 && res.SwapsOut == 0 {
					t.Fatalf("finished without parking: %+v", res)
				}
			}
		})
	}
}
