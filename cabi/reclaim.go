package main

// The host's reclaimers (memscale_set_reclaimer), the reclaim shortfall that
// memscale_dtr_reclaim records for the out-of-memory message, and the
// one-time warning about an eviction threshold that nothing enforces.
//
// This file has no //export, so its preamble may define C functions: the
// trampoline through which Go calls the host's function pointer.

/*
#include <stdint.h>
#include "memscale.h"

// memscale_reclaim_depth counts the reclaimer calls in progress on this
// thread. A memscale_malloc made by the reclaimer itself runs on the same
// thread (C -> Go callbacks do), and must not call the reclaimer again.
static __thread int memscale_reclaim_depth;

// memscale_call_reclaimer calls the reclaimer fn(device, need, ctx); 0 when
// one is already running on this thread. The pointers cross from Go as
// integers so that Go never makes an unsafe.Pointer of one.
static int64_t memscale_call_reclaimer(uintptr_t fn, int device, int64_t need, uintptr_t ctx) {
	if (memscale_reclaim_depth > 0) {
		return 0;
	}
	memscale_reclaim_depth++;
	int64_t got = ((memscale_reclaimer)fn)(device, need, (void*)ctx);
	memscale_reclaim_depth--;
	return got;
}
*/
import "C"

import (
	"fmt"
	"math"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/memscale/memscale/allocator"
)

// hostReclaimer is a reclaimer the host installed: its C function and the
// context it is called with (fn 0: none).
type hostReclaimer struct {
	fn, ctx C.uintptr_t
}

// reclaimers holds the reclaimer of each device ordinal, installed before or
// after its allocator was created. Guarded by devicesMu, which also
// serialises creating allocators, so a reclaimer set while a device opens is
// installed exactly once, by whichever comes second.
var reclaimers [maxDevices]hostReclaimer

// setReclaimer records the reclaimer of device d and installs it in the
// device's allocator if it exists (openDevice installs it otherwise).
// Installing one on a device that could not be opened is an error: it would
// never be called.
func setReclaimer(d int, r hostReclaimer) error {
	if d < 0 || d >= maxDevices {
		return fmt.Errorf("device %d: %w: accepted 0 to %d", d, errDeviceRange, maxDevices-1)
	}
	devicesMu.Lock()
	defer devicesMu.Unlock()
	reclaimers[d] = r
	s := devices[d].Load()
	if s == nil {
		return nil // installed when the device opens
	}
	if s.err != nil {
		if r.fn == 0 {
			return nil // nothing was installed there, nothing to remove
		}
		return fmt.Errorf("device %d could not be opened, so its reclaimer would never be called (fix the device first): %w", d, s.err)
	}
	s.alloc.SetReclaimer(r.allocatorReclaimer(d))
	return nil
}

// allocatorReclaimer returns the allocator.Reclaimer that calls r for device
// d (nil when r is none). A negative return counts as 0.
func (r hostReclaimer) allocatorReclaimer(d int) allocator.Reclaimer {
	if r.fn == 0 {
		return nil
	}
	return func(need uint64) uint64 {
		got := int64(C.memscale_call_reclaimer(r.fn, C.int(d), C.int64_t(min(need, math.MaxInt64)), r.ctx))
		return uint64(max(got, 0))
	}
}

// lastShortfall is the most recent reclaim shortfall of the process: why a
// memscale_dtr_reclaim could not find the bytes it was asked for. seq
// counts them, so a malloc can tell whether one was recorded while it ran.
var lastShortfall struct {
	seq  atomic.Uint64
	text atomic.Pointer[string]
}

// recordShortfall records the shortfall of engine h, described by why.
func recordShortfall(h int64, why string) {
	text := fmt.Sprintf("engine %d: %s", h, why)
	lastShortfall.text.Store(&text)
	lastShortfall.seq.Add(1)
}

// shortfallSince returns the last reclaim shortfall if one was recorded
// since seq was read from lastShortfall.seq, else "".
func shortfallSince(seq uint64) string {
	if lastShortfall.seq.Load() == seq {
		return ""
	}
	if p := lastShortfall.text.Load(); p != nil {
		return *p
	}
	return ""
}

// mallocError is memscale_malloc's error for a request of size bytes on
// device dev that the allocator refused with err; seq is lastShortfall.seq
// before the request. An out-of-memory error gets the reclaim shortfall
// recorded during the request, if any.
func mallocError(size int64, dev int, err error, seq uint64) error {
	if why := shortfallSince(seq); why != "" {
		return fmt.Errorf("%d bytes on device %d: %w; the DTR engine could not free enough: %s", size, dev, err, why)
	}
	return fmt.Errorf("%d bytes on device %d: %w", size, dev, err)
}

// The warning about an eviction threshold nothing enforces: the allocator
// only stores the threshold; the DTR engine of the Python package evicts.
var (
	// thresholdWatch is set while some device has a threshold and the
	// warning was not given: the only thing malloc reads otherwise.
	thresholdWatch atomic.Bool
	// thresholdWarned is set once the warning was given.
	thresholdWarned atomic.Bool
	// liveEngines counts the engines created and not destroyed.
	liveEngines atomic.Int64
)

// watchThreshold is told of a threshold set on a device (at open or with
// memscale_set_threshold).
func watchThreshold(bytes uint64) {
	if bytes > 0 && !thresholdWarned.Load() {
		thresholdWatch.Store(true)
	}
}

// checkThreshold warns, once per process, when the allocations of device
// dev exceed its eviction threshold while no DTR engine exists. Called
// after a successful malloc while thresholdWatch is set.
func checkThreshold(a *allocator.Allocator, dev int) {
	t := a.EvictionThreshold()
	if t == 0 || liveEngines.Load() > 0 {
		return
	}
	allocated := a.Allocated()
	if allocated <= t || !thresholdWarned.CompareAndSwap(false, true) {
		return
	}
	thresholdWatch.Store(false)
	processLogger().Warn(thresholdWarning(dev, t, allocated),
		zap.Int("device", dev), zap.Uint64("eviction_threshold", t), zap.Uint64("allocated", allocated))
}

// thresholdWarning is the text of the one-time warning.
func thresholdWarning(dev int, threshold, allocated uint64) string {
	return fmt.Sprintf("the eviction threshold of device %d is %d bytes and allocated is %d bytes, but nothing "+
		"evicts: eviction needs the memscale Python package (no DTR engine exists in this process); enable it with "+
		"`python -m memscale run your_script.py` (or call memscale.enable() in the script). "+
		"This warning is given once per process", dev, threshold, allocated)
}
