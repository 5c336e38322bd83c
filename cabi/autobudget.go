package main

import (
	"fmt"
	"sync"
)

// The DTR budget the allocator's cache bound follows (allocator.SetBudget,
// docs/allocator-budget.md) is told to it automatically: an engine created
// with "usage": "allocator" and a budget registers that budget for its
// device, memscale_dtr_set_budget updates the registration, and
// memscale_dtr_destroy removes it.
//
// Semantics: registrations, not last writer. Each live engine holds one
// registration; the allocator's budget is the largest of the device's
// registered budgets and of the value last given to memscale_set_budget
// (the explicit budget, 0 = none). Engines reading the same allocator all
// hold its allocated bytes under their own budget, so the largest is the
// one the cache may need; a smaller one only binds while its engine runs.
// When the last engine closes, the allocator's budget returns to the
// explicit value (0 unless the host set one). Engines without a budget
// (measuring) or in stress mode register nothing.
var budgets = struct {
	sync.Mutex
	dev map[int]*deviceBudgets
}{dev: map[int]*deviceBudgets{}}

// deviceBudgets are the budgets told to one device's allocator.
type deviceBudgets struct {
	explicit uint64           // memscale_set_budget
	engines  map[int64]uint64 // engine handle -> its budget (> 0)
}

// effective returns the budget the allocator gets.
func (b *deviceBudgets) effective() uint64 {
	m := b.explicit
	for _, v := range b.engines {
		m = max(m, v)
	}
	return m
}

// updateBudget changes device dev's registrations with fn and tells its
// allocator the resulting budget.
func updateBudget(dev int, fn func(b *deviceBudgets)) error {
	budgets.Lock()
	defer budgets.Unlock()
	b := budgets.dev[dev]
	if b == nil {
		b = &deviceBudgets{engines: map[int64]uint64{}}
		budgets.dev[dev] = b
	}
	fn(b)
	a, err := allocatorFor(dev)
	if err != nil {
		return fmt.Errorf("device %d: telling the allocator the DTR budget: %w", dev, err)
	}
	a.SetBudget(b.effective())
	return nil
}

// setExplicitBudget records memscale_set_budget's value for dev.
func setExplicitBudget(dev int, bytes uint64) error {
	return updateBudget(dev, func(b *deviceBudgets) { b.explicit = bytes })
}

// registerEngineBudget records engine h's budget on dev (0 removes it).
func registerEngineBudget(dev int, h int64, bytes uint64) error {
	return updateBudget(dev, func(b *deviceBudgets) {
		if bytes == 0 {
			delete(b.engines, h)
			return
		}
		b.engines[h] = bytes
	})
}
