package main

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/memscale/memscale/allocator"
	"github.com/memscale/memscale/device"
	"github.com/memscale/memscale/device/backend"
	"github.com/memscale/memscale/device/sim"
	"github.com/memscale/memscale/internal/config"
	"github.com/memscale/memscale/internal/logging"
)

// maxDevices bounds the device ordinals the library accepts.
const maxDevices = 64 // = MEMSCALE_PUBLISHED_DEVICES (memscale_internal.h); a test checks

// process is what the library reads once per process, at the first call that
// needs it: the configuration from the environment and the logger.
type process struct {
	// cfg is the configuration; on error the bad variables keep defaults.
	cfg config.Config
	// err is the configuration error; while it is set every allocation fails
	// with it.
	err error
	// log is never nil.
	log *zap.Logger
	// deviceCount is what memscale_init was told (0: not called).
	deviceCount atomic.Int64
}

var (
	processOnce sync.Once
	proc        process
)

// loadProcess returns the process state, reading the environment on the first
// call. Nothing in here may call setError or guard (they call loadProcess).
func loadProcess() *process {
	processOnce.Do(func() {
		proc.cfg, proc.err = config.Load(cLookupEnv)
		if proc.err != nil {
			proc.err = fmt.Errorf("bad memscale configuration in the environment: %w", proc.err)
		}
		// The level and format are valid even when the configuration is not:
		// Load keeps the defaults for bad variables.
		log, err := logging.New(proc.cfg.LogLevel, proc.cfg.LogFormat)
		if err != nil {
			log = zap.NewNop()
		}
		proc.log = log
		if proc.err != nil {
			log.Error("configuration rejected; every allocation will fail", zap.Error(proc.err))
		}
		if unknown := config.Unknown(cEnviron()); len(unknown) > 0 {
			log.Warn("unknown MEMSCALE_* environment variables ignored (typos?)",
				zap.Strings("variables", unknown), zap.Strings("known", config.KnownVars()))
		}
	})
	return &proc
}

// processLogger returns the process logger.
func processLogger() *zap.Logger { return loadProcess().log }

// deviceState is one device and its allocator. It is created once per ordinal
// and never replaced: a failure to open the device is kept in err and
// returned by every later call for that ordinal.
type deviceState struct {
	ordinal int
	dev     device.Device
	alloc   *allocator.Allocator
	info    device.Info
	limits  config.Limits
	err     error
	// streams holds the streams (device.Stream keys) that dev.CheckStream
	// accepted, so that a stream is asked about once, not at every call.
	streams sync.Map
}

var (
	// devices holds the state of each ordinal once opened (or failed).
	devices [maxDevices]atomic.Pointer[deviceState]
	// devicesMu serialises opening devices.
	devicesMu sync.Mutex
)

// errDeviceRange reports a device ordinal outside [0, maxDevices).
var errDeviceRange = errors.New("device ordinal out of range")

// allocatorFor returns the allocator of device d, opening the device on first
// use. This is the hot path of every allocation: one bounds check and one
// atomic load once the device is open.
func allocatorFor(d int) (*allocator.Allocator, error) {
	if uint(d) < maxDevices {
		if s := devices[d].Load(); s != nil && s.alloc != nil {
			return s.alloc, nil
		}
	}
	s, err := openDevice(d)
	if err != nil {
		return nil, err
	}
	return s.alloc, nil
}

// openDevice returns the state of device d, creating the device and its
// allocator if this is the first use.
func openDevice(d int) (*deviceState, error) {
	if d < 0 || d >= maxDevices {
		return nil, fmt.Errorf("device %d: %w: accepted 0 to %d", d, errDeviceRange, maxDevices-1)
	}
	p := loadProcess()
	if p.err != nil {
		return nil, p.err
	}
	devicesMu.Lock()
	defer devicesMu.Unlock()
	if s := devices[d].Load(); s != nil {
		return s, s.err
	}
	s := &deviceState{ordinal: d}
	s.err = s.open(p)
	if s.err != nil {
		p.log.Error("cannot open device; every call for it will fail", zap.Int("device", d), zap.Error(s.err))
	}
	devices[d].Store(s)
	return s, s.err
}

// open creates the device and its allocator from the configuration, and
// installs the reclaimer set for the ordinal, if any. The caller holds
// devicesMu.
func (s *deviceState) open(p *process) error {
	cfg := p.cfg
	log := p.log.With(zap.Int("device", s.ordinal))
	dev, err := backend.Open(string(cfg.Backend), s.ordinal, sim.Config{Capacity: cfg.SimCapacity}, log)
	if err != nil {
		return fmt.Errorf("device %d: opening backend %q (%s): %w", s.ordinal, cfg.Backend, config.EnvBackend, err)
	}
	info := dev.Info()
	limits, err := cfg.Resolve(info.TotalMemory)
	if err != nil {
		_ = dev.Close()
		return fmt.Errorf("device %d (%s, %d bytes): %w", s.ordinal, info.Name, info.TotalMemory, err)
	}
	a, err := allocator.New(allocator.Config{
		Device:            dev,
		Limit:             limits.MemoryLimit,
		EvictionThreshold: limits.EvictionThreshold,
		TraceCapacity:     cfg.TraceCapacity,
		BudgetSlack:       cfg.BudgetSlack,
		Logger:            log,
	})
	if err != nil {
		_ = dev.Close()
		return fmt.Errorf("device %d: creating the allocator: %w", s.ordinal, err)
	}
	s.dev, s.alloc, s.info, s.limits = dev, a, info, limits
	// The caller holds devicesMu, which guards reclaimers.
	a.SetReclaimer(reclaimers[s.ordinal].allocatorReclaimer(s.ordinal))
	watchThreshold(limits.EvictionThreshold)
	log.Info("device opened", zap.String("backend", info.Backend), zap.String("name", info.Name),
		zap.Uint64("total_memory", info.TotalMemory), zap.Uint64("memory_limit", limits.MemoryLimit),
		zap.Uint64("eviction_threshold", limits.EvictionThreshold))
	return nil
}

// openDevices returns the devices opened successfully so far, by ordinal.
func openDevices() []*deviceState {
	var out []*deviceState
	for i := range devices {
		if s := devices[i].Load(); s != nil && s.alloc != nil {
			out = append(out, s)
		}
	}
	return out
}

// deviceAllocated is the allocator of device d, whose allocated bytes
// (allocated_bytes.all.current) and watermark engines with usage
// "allocator" read.
func deviceAllocated(d int) (allocatedSource, error) {
	a, err := allocatorFor(d)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// init connects the engine (engine.go) to the allocators: engines created with
// "usage": "allocator" read a device's allocated bytes through it.
func init() { allocatorUsage = deviceAllocated }
