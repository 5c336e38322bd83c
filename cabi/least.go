package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/memscale/memscale/autotune"
	"github.com/memscale/memscale/evict"
)

// An engine created with "least_budget": true records its program, and when
// the step finishes (memscale_dtr_finish) searches for the least budget at
// which that program runs (autotune.LeastBudget: replays upward from the
// engine's minimum budget, a lower bound, to a budget the step ran at). Its
// stats report the result as "least_budget" (the report's keys, or "error"),
// for the host to name when a later step of the same shapes is given less.
// The search runs once, at the first finish.

// leastKey is memscale_dtr_create's key for it; the rest of the
// configuration is evict's.
const leastKey = "least_budget"

// leastStats is what the stats JSON reports under leastKey.
type leastStats struct {
	*autotune.LeastReport
	Error string `json:"error,omitempty"`
}

// takeLeastKey removes leastKey from a memscale_dtr_create configuration and
// returns the rest and its value (false when absent).
func takeLeastKey(data []byte) ([]byte, bool, error) {
	if !bytes.Contains(data, []byte(leastKey)) {
		return data, false, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return data, false, nil // evict's decoder names what is wrong with it
	}
	v, ok := raw[leastKey]
	if !ok {
		return data, false, nil
	}
	var want bool
	if err := json.Unmarshal(v, &want); err != nil {
		return nil, false, fmt.Errorf("dtr config: %q: %s is not a bool (true: search the least budget the step runs at when it finishes)", leastKey, v)
	}
	delete(raw, leastKey)
	rest, err := json.Marshal(raw)
	if err != nil {
		return nil, false, fmt.Errorf("dtr config: %w", err)
	}
	return rest, want, nil
}

// searchLeast runs the search for d's engine once (at its first finish).
func (d *dtrHandle) searchLeast() {
	if !d.wantLeast || d.least != nil {
		return
	}
	d.least = &leastStats{}
	rep, err := leastOf(d.eng)
	if err != nil {
		d.least.Error = err.Error()
		return
	}
	d.least.LeastReport = &rep
}

// leastOf searches the least budget of eng's recorded program: from its
// minimum budget up to its budget. An unbudgeted step's peak is no budget
// known to work: without a budget the engine frees a released storage at
// once, while under one it keeps a released external that a live tensor was
// computed from (pinned, it cannot be evicted; the DCGAN's step on fakes
// peaked at 561.8 KiB unbudgeted and needs 946.7 KiB budgeted), so the
// search of an unbudgeted step has no ceiling and replays until one finishes.
func leastOf(eng *evict.Engine) (autotune.LeastReport, error) {
	tr, err := eng.Recording()
	if err != nil {
		return autotune.LeastReport{}, err
	}
	return autotune.LeastBudget(tr, autotune.LeastOptions{
		Floor: eng.MinBudget().Bytes(), Ceiling: eng.Budget(), Engine: eng.Config(),
	})
}
