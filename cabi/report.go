package main

/*
#include "memscale_internal.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"

	"github.com/memscale/memscale/internal/config"
)

// configJSON renders the effective configuration: the parsed environment, the
// library version, and the resolved sizes of every device opened so far.
func configJSON() ([]byte, error) {
	p := loadProcess()
	if p.err != nil {
		return nil, p.err
	}
	r := configReport{
		Config:           p.cfg,
		Version:          C.GoString(C.memscale_version()),
		DeviceCount:      p.deviceCount.Load(),
		Devices:          []deviceReport{},
		UnknownVariables: config.Unknown(cEnviron()),
		Heuristics:       config.Heuristics(),
	}
	for _, s := range openDevices() {
		r.Devices = append(r.Devices, deviceReport{
			Ordinal:           s.ordinal,
			Backend:           s.info.Backend,
			Name:              s.info.Name,
			TotalMemory:       s.info.TotalMemory,
			Granularity:       s.info.Granularity,
			VMM:               s.info.VMM,
			MemoryLimit:       s.limits.MemoryLimit,
			EvictionThreshold: s.limits.EvictionThreshold,

			LimitBytes:             s.alloc.Limit(),
			EvictionThresholdBytes: s.alloc.EvictionThreshold(),
		})
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encoding the configuration: %w", err)
	}
	return b, nil
}

// torchSnapshot is the part of torch.cuda.memory._snapshot()'s shape that
// memscale_snapshot_json merges across devices.
type torchSnapshot struct {
	Segments     []json.RawMessage   `json:"segments"`
	DeviceTraces [][]json.RawMessage `json:"device_traces"`
}

// snapshotJSON merges the snapshots of every open device into one object in
// torch's shape: all segments in one list (each names its device), and
// device_traces[i] holding the trace of device i (empty for devices not open).
func snapshotJSON() ([]byte, error) {
	out := torchSnapshot{Segments: []json.RawMessage{}, DeviceTraces: [][]json.RawMessage{}}
	for _, s := range openDevices() {
		b, err := json.Marshal(s.alloc.Snapshot())
		if err != nil {
			return nil, fmt.Errorf("device %d: encoding the snapshot: %w", s.ordinal, err)
		}
		var one torchSnapshot
		if err := json.Unmarshal(b, &one); err != nil {
			return nil, fmt.Errorf("device %d: snapshot is not in torch's shape: %w", s.ordinal, err)
		}
		out.Segments = append(out.Segments, one.Segments...)
		for len(out.DeviceTraces) <= s.ordinal {
			out.DeviceTraces = append(out.DeviceTraces, []json.RawMessage{})
		}
		var trace []json.RawMessage
		for _, t := range one.DeviceTraces {
			trace = append(trace, t...)
		}
		if trace == nil {
			trace = []json.RawMessage{}
		}
		out.DeviceTraces[s.ordinal] = trace
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encoding the snapshot: %w", err)
	}
	return b, nil
}

// configReport is the JSON of memscale_config_json.
type configReport struct {
	config.Config
	// Version is the library version.
	Version string `json:"version"`
	// DeviceCount is what memscale_init was told (0: not called).
	DeviceCount int64 `json:"device_count"`
	// Devices are the devices opened so far, with the sizes resolved.
	Devices []deviceReport `json:"devices"`
	// UnknownVariables are MEMSCALE_* variables memscale does not read.
	UnknownVariables []string `json:"unknown_variables,omitempty"`
	// Heuristics are the accepted eviction heuristic names, so that callers
	// (the Python Config) validate against the engine instead of a copy.
	Heuristics []config.Heuristic `json:"heuristics"`
}

// deviceReport describes one open device in configReport.
type deviceReport struct {
	Ordinal     int    `json:"ordinal"`
	Backend     string `json:"backend"`
	Name        string `json:"name"`
	TotalMemory uint64 `json:"total_memory"`
	Granularity uint64 `json:"granularity"`
	VMM         bool   `json:"vmm"`
	// MemoryLimit and EvictionThreshold are the environment's values resolved
	// for this device (0: capacity / none).
	MemoryLimit       uint64 `json:"memory_limit"`
	EvictionThreshold uint64 `json:"eviction_threshold"`
	// LimitBytes and EvictionThresholdBytes are in force now (after
	// memscale_set_limit, memscale_set_memory_fraction, memscale_set_threshold).
	LimitBytes             uint64 `json:"limit_bytes"`
	EvictionThresholdBytes uint64 `json:"eviction_threshold_bytes"`
}
