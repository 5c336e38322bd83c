package main

/*
#include <stdint.h>
#include "memscale_internal.h"
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"go.uber.org/zap"

	"github.com/memscale/memscale/allocator"
	"github.com/memscale/memscale/device"
	"github.com/memscale/memscale/device/sim"
	"github.com/memscale/memscale/internal/config"
)

// errSizeMismatch is reported when memscale_free is given a size other than
// the one requested at allocation. The block is freed all the same: the
// allocator knows its real size.
var errSizeMismatch = errors.New("size passed to free differs from the allocated size")

// Size 0: memscale_malloc(0) returns a valid, unique pointer to a
// minimum-size block (the allocator's behaviour), not NULL and not an error.
// PyTorch's pluggable path calls alloc for empty tensors too and keys its own
// bookkeeping on the returned pointer, so a unique, freeable pointer is the
// safe answer, and NULL keeps meaning "failed".

//export memscale_go_malloc
func memscale_go_malloc(size C.int64_t, dev C.int, stream C.uintptr_t) (ptr C.uintptr_t) {
	guard("memscale_malloc", func() error {
		if size < 0 {
			return fmt.Errorf("invalid size %d on device %d: negative: %w", int64(size), int(dev), allocator.ErrInvalidSize)
		}
		a, err := allocatorFor(int(dev))
		if err != nil {
			return err
		}
		if err := checkStream(int(dev), device.Stream(stream)); err != nil {
			return fmt.Errorf("%d bytes on device %d: %w", int64(size), int(dev), err)
		}
		seq := lastShortfall.seq.Load()
		p, err := a.Malloc(uint64(size), device.Stream(stream))
		if err != nil {
			return mallocError(int64(size), int(dev), err, seq)
		}
		if thresholdWatch.Load() {
			checkThreshold(a, int(dev))
		}
		publishAllocated(a, int(dev))
		ptr = C.uintptr_t(p)
		return nil
	})
	return ptr
}

// publishAllocated writes a's allocated bytes where
// memscale_allocated_address points, for readers that must not make a call.
func publishAllocated(a *allocator.Allocator, dev int) {
	if dev >= 0 && dev < C.MEMSCALE_PUBLISHED_DEVICES {
		C.memscale_published_allocated[dev] = C.int64_t(a.Allocated())
	}
}

// memscale_go_free frees ptr. The stream is only checked (a handle that is
// not a stream of the device is refused, nothing freed): the allocator
// remembers the allocation stream and the streams recorded with
// memscale_record_stream. ptr is never NULL here (abi.c filters it).
//
//export memscale_go_free
func memscale_go_free(ptr C.uintptr_t, size C.int64_t, dev C.int, stream C.uintptr_t) {
	guard("memscale_free", func() error {
		p := device.Ptr(ptr)
		a, err := allocatorFor(int(dev))
		if err != nil {
			return fmt.Errorf("pointer %#x: %w", uintptr(p), err)
		}
		if err := checkStream(int(dev), device.Stream(stream)); err != nil {
			return fmt.Errorf("pointer %#x on device %d (not freed): %w", uintptr(p), int(dev), err)
		}
		recorded, err := a.FreeRequested(p)
		publishAllocated(a, int(dev))
		if errors.Is(err, allocator.ErrUnknownPointer) || errors.Is(err, allocator.ErrDoubleFree) {
			return freeElsewhere(p, int64(size), int(dev), err)
		}
		if err != nil {
			return fmt.Errorf("pointer %#x (%d bytes) on device %d: %w", uintptr(p), recorded, int(dev), err)
		}
		if size < 0 || uint64(size) != recorded {
			return fmt.Errorf("pointer %#x on device %d freed with size %d but %d bytes were allocated (the block was freed): %w",
				uintptr(p), int(dev), int64(size), recorded, errSizeMismatch)
		}
		return nil
	})
}

// freeElsewhere handles a pointer that device dev does not own (notOurs is
// its allocator's verdict: unknown pointer or double free): if another open
// device owns it, it is freed there and the wrong device is reported;
// otherwise notOurs is returned and nothing is freed.
func freeElsewhere(p device.Ptr, size int64, dev int, notOurs error) error {
	for _, s := range openDevices() {
		if s.ordinal == dev {
			continue
		}
		if _, ok := s.alloc.SizeOf(p); ok {
			if err := s.alloc.Free(p); err != nil {
				return fmt.Errorf("pointer %#x passed with device %d belongs to device %d: %w", uintptr(p), dev, s.ordinal, err)
			}
			return fmt.Errorf("pointer %#x passed with device %d belongs to device %d (freed there): %w",
				uintptr(p), dev, s.ordinal, allocator.ErrUnknownPointer)
		}
	}
	return fmt.Errorf("pointer %#x (size %d) on device %d: %w", uintptr(p), size, dev, notOurs)
}

//export memscale_go_init
func memscale_go_init(count C.int) {
	guard("memscale_init", func() error {
		p := loadProcess()
		p.deviceCount.Store(int64(count))
		p.log.Info("initialised by the host", zap.Int("device_count", int(count)))
		return p.err
	})
}

//export memscale_go_empty_cache
func memscale_go_empty_cache() {
	guard("memscale_empty_cache", func() error {
		var errs []error
		for _, s := range openDevices() {
			if err := s.alloc.EmptyCache(); err != nil {
				errs = append(errs, fmt.Errorf("device %d: %w", s.ordinal, err))
			}
		}
		return errors.Join(errs...)
	})
}

//export memscale_go_set_memory_fraction
func memscale_go_set_memory_fraction(fraction C.double, dev C.int) {
	guard("memscale_set_memory_fraction", func() error {
		f := float64(fraction)
		if math.IsNaN(f) || f <= 0 || f > 1 {
			return fmt.Errorf("fraction %v for device %d: %w: accepted 0 < fraction <= 1", f, int(dev), allocator.ErrInvalidArgument)
		}
		a, err := allocatorFor(int(dev))
		if err != nil {
			return err
		}
		if err := a.SetMemoryFraction(f); err != nil {
			return fmt.Errorf("fraction %v for device %d: %w", f, int(dev), err)
		}
		return nil
	})
}

//export memscale_go_record_stream
func memscale_go_record_stream(ptr C.uintptr_t, stream C.uintptr_t) {
	guard("memscale_record_stream", func() error {
		p := device.Ptr(ptr)
		for _, s := range openDevices() {
			if _, ok := s.alloc.SizeOf(p); ok {
				if err := s.alloc.RecordStream(p, device.Stream(stream)); err != nil {
					return fmt.Errorf("pointer %#x on device %d, stream %#x: %w", uintptr(p), s.ordinal, uintptr(stream), err)
				}
				return nil
			}
		}
		return fmt.Errorf("pointer %#x (stream %#x): %w", uintptr(p), uintptr(stream), allocator.ErrUnknownPointer)
	})
}

//export memscale_go_stats_json
func memscale_go_stats_json(dev C.int) (out *C.char) {
	guard("memscale_stats_json", func() error {
		a, err := allocatorFor(int(dev))
		if err != nil {
			return err
		}
		b, err := json.Marshal(a.Stats())
		if err != nil {
			return fmt.Errorf("device %d: encoding stats: %w", int(dev), err)
		}
		out = cString(string(b))
		return nil
	})
	return out
}

//export memscale_go_snapshot_json
func memscale_go_snapshot_json() (out *C.char) {
	guard("memscale_snapshot_json", func() error {
		b, err := snapshotJSON()
		if err != nil {
			return err
		}
		out = cString(string(b))
		return nil
	})
	return out
}

//export memscale_go_reset_peak_stats
func memscale_go_reset_peak_stats(dev C.int) C.int {
	return status(guard("memscale_reset_peak_stats", func() error {
		a, err := allocatorFor(int(dev))
		if err != nil {
			return err
		}
		a.ResetPeakStats()
		return nil
	}))
}

//export memscale_go_set_threshold
func memscale_go_set_threshold(dev C.int, bytes C.int64_t) C.int {
	return status(guard("memscale_set_threshold", func() error {
		if bytes < 0 {
			return fmt.Errorf("threshold %d bytes for device %d: negative: %w", int64(bytes), int(dev), allocator.ErrInvalidSize)
		}
		a, err := allocatorFor(int(dev))
		if err != nil {
			return err
		}
		a.SetEvictionThreshold(uint64(bytes))
		watchThreshold(uint64(bytes))
		return nil
	}))
}

// memscale_go_set_budget tells device dev's allocator the DTR budget that
// an engine holds its allocated bytes under (0 = none: the eviction
// threshold stands for it), so that its cache may keep up to the budget plus
// the budget slack mapped instead of remapping granules (allocator.SetBudget).
// Engines created with "usage": "allocator" and a budget tell it theirs
// themselves; the allocator follows the largest of this value and theirs
// (autobudget.go).
//
//export memscale_go_set_budget
func memscale_go_set_budget(dev C.int, bytes C.int64_t) C.int {
	return status(guard("memscale_set_budget", func() error {
		if bytes < 0 {
			return fmt.Errorf("budget %d bytes for device %d: negative: %w", int64(bytes), int(dev), allocator.ErrInvalidSize)
		}
		if _, err := allocatorFor(int(dev)); err != nil {
			return err
		}
		// The engines with "usage": "allocator" register their budgets
		// too; the allocator gets the largest (autobudget.go).
		return setExplicitBudget(int(dev), uint64(bytes))
	}))
}

// memscale_go_set_budget_slack sets device dev's budget slack
// (allocator.SetBudgetSlack: 0 = the default, negative = ignore the budget).
//
//export memscale_go_set_budget_slack
func memscale_go_set_budget_slack(dev C.int, slack C.double) C.int {
	return status(guard("memscale_set_budget_slack", func() error {
		a, err := allocatorFor(int(dev))
		if err != nil {
			return err
		}
		if err := a.SetBudgetSlack(float64(slack)); err != nil {
			return fmt.Errorf("device %d: %w", int(dev), err)
		}
		return nil
	}))
}

// memscale_go_step_boundary tells device dev's allocator that a training
// step ended and the next begins (allocator.StepBoundary): with a DTR budget
// known, the step just ended becomes the placement plan of the next one, so
// a repeating step stops remapping granules (allocator/plan.go). Without a
// budget it only counts steps. Call it once per optimizer step, from any
// thread, at a point where the step's activations are freed.
//
//export memscale_go_step_boundary
func memscale_go_step_boundary(dev C.int) C.int {
	return status(guard("memscale_step_boundary", func() error {
		a, err := allocatorFor(int(dev))
		if err != nil {
			return err
		}
		a.StepBoundary()
		return nil
	}))
}

// memscale_go_set_reclaimer installs (fn != 0) or removes (fn 0) the
// reclaimer of device dev: now if its allocator exists, else when it is
// created. fn and ctx are the C function pointer and its context.
//
//export memscale_go_set_reclaimer
func memscale_go_set_reclaimer(dev C.int, fn C.uintptr_t, ctx C.uintptr_t) C.int {
	return status(guard("memscale_set_reclaimer", func() error {
		return setReclaimer(int(dev), hostReclaimer{fn: fn, ctx: ctx})
	}))
}

//export memscale_go_set_limit
func memscale_go_set_limit(dev C.int, bytes C.int64_t) C.int {
	return status(guard("memscale_set_limit", func() error {
		if bytes < 0 {
			return fmt.Errorf("limit %d bytes for device %d: negative: %w", int64(bytes), int(dev), allocator.ErrInvalidSize)
		}
		a, err := allocatorFor(int(dev))
		if err != nil {
			return err
		}
		if err := a.SetLimit(uint64(bytes)); err != nil {
			return fmt.Errorf("limit %d bytes for device %d: %w", int64(bytes), int(dev), err)
		}
		return nil
	}))
}

//export memscale_go_allocated
func memscale_go_allocated(dev C.int) C.int64_t {
	n := C.int64_t(-1)
	guard("memscale_allocated", func() error {
		a, err := allocatorFor(int(dev))
		if err != nil {
			return err
		}
		n = C.int64_t(a.Allocated())
		return nil
	})
	return n
}

//export memscale_go_config_json
func memscale_go_config_json() (out *C.char) {
	guard("memscale_config_json", func() error {
		b, err := configJSON()
		if err != nil {
			return err
		}
		out = cString(string(b))
		return nil
	})
	return out
}

// status maps guard's result to the C convention: 0 on success, -1 on error.
func status(failed bool) C.int {
	if failed {
		return -1
	}
	return 0
}

// checkStream reports an error naming the handle when device dev, already
// opened by allocatorFor, cannot order work on stream s: a handle that is not
// a stream (a made-up value, refused by the driver or the sim as
// CUDA_ERROR_INVALID_HANDLE is), or another device's stream. The default
// streams (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) are valid everywhere
// and cost nothing; another stream is asked about once per device and then
// remembered (a program makes few streams: PyTorch keeps a fixed pool).
func checkStream(dev int, s device.Stream) error {
	if s <= 2 {
		return nil
	}
	st := devices[dev].Load()
	if _, ok := st.streams.Load(s); ok {
		return nil
	}
	if err := st.dev.CheckStream(s); err != nil {
		return fmt.Errorf("stream %#x: %w", uintptr(s), err)
	}
	st.streams.Store(s, struct{}{})
	return nil
}

// simDevice returns device dev's simulated device, or an error saying that
// the call needs MEMSCALE_BACKEND=sim.
func simDevice(op string, dev int) (*sim.Device, error) {
	if _, err := allocatorFor(dev); err != nil {
		return nil, err
	}
	d, ok := devices[dev].Load().dev.(*sim.Device)
	if !ok {
		return nil, fmt.Errorf("device %d is not simulated (%s=sim): %s makes streams of the sim only; "+
			"on a GPU make them with cudaStreamCreate", dev, config.EnvBackend, op)
	}
	return d, nil
}

// memscale_go_sim_stream_create makes a stream of simulated device dev (the
// sim's cuStreamCreate) and writes its handle to out; -1 on error.
//
//export memscale_go_sim_stream_create
func memscale_go_sim_stream_create(dev C.int, out *C.uintptr_t) C.int {
	failed := guard("memscale_sim_stream_create", func() error {
		if out == nil {
			return fmt.Errorf("device %d: the output pointer is NULL", int(dev))
		}
		d, err := simDevice("memscale_sim_stream_create", int(dev))
		if err != nil {
			return err
		}
		s, err := d.CreateStream()
		if err != nil {
			return fmt.Errorf("device %d: %w", int(dev), err)
		}
		*out = C.uintptr_t(s)
		return nil
	})
	if failed {
		return -1
	}
	return 0
}

// memscale_go_sim_stream_destroy destroys a stream made by
// memscale_go_sim_stream_create; -1 on error. Its handle is then refused.
//
//export memscale_go_sim_stream_destroy
func memscale_go_sim_stream_destroy(dev C.int, stream C.uintptr_t) C.int {
	failed := guard("memscale_sim_stream_destroy", func() error {
		d, err := simDevice("memscale_sim_stream_destroy", int(dev))
		if err != nil {
			return err
		}
		if err := d.DestroyStream(device.Stream(stream)); err != nil {
			return fmt.Errorf("device %d: %w", int(dev), err)
		}
		devices[int(dev)].Load().streams.Delete(device.Stream(stream))
		return nil
	})
	if failed {
		return -1
	}
	return 0
}
