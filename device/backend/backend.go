// Package backend opens the device implementation named by MEMSCALE_BACKEND:
// "cuda" (the CUDA driver, device/cuda), "sim" (the host-memory simulation,
// device/sim) or "auto" (cuda when a driver and at least one device are
// present, else sim).
package backend

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/memscale/memscale/device"
	"github.com/memscale/memscale/device/cuda"
	"github.com/memscale/memscale/device/sim"
)

// Names of the backends.
const (
	Auto = "auto"
	CUDA = "cuda"
	Sim  = "sim"
)

// Accepted lists the accepted backend names, for messages.
const Accepted = "auto, cuda, sim"

// checkName validates a backend name; "" means auto.
func checkName(name string) (string, error) {
	switch name {
	case "":
		return Auto, nil
	case Auto, CUDA, Sim:
		return name, nil
	}
	return "", fmt.Errorf("backend %q: unknown backend; accepted values: %s", name, Accepted)
}

// cudaUsable reports whether the CUDA backend can be used, and why not.
func cudaUsable() (n int, why error) {
	n, err := cuda.DeviceCount()
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("cuda: the driver reports no CUDA devices: %w", device.ErrUnavailable)
	}
	return n, nil
}

// Choice is the outcome of resolving a backend name.
type Choice struct {
	// Requested is the name asked for ("" is reported as "auto").
	Requested string
	// Backend is what Open uses: "cuda" or "sim".
	Backend string
	// CUDADevices is the number of CUDA devices when Backend is "cuda".
	CUDADevices int
	// Fallback says why auto chose sim; "" otherwise.
	Fallback string
}

// Choose resolves name ("auto", "cuda", "sim"; "" means auto) to the backend
// Open would use, without opening anything. Choosing "cuda" explicitly fails
// (wrapping device.ErrUnavailable) when no driver or device is present.
func Choose(name string) (Choice, error) {
	name, err := checkName(name)
	if err != nil {
		return Choice{}, err
	}
	c := Choice{Requested: name, Backend: Sim}
	if name == Sim {
		return c, nil
	}
	n, why := cudaUsable()
	switch {
	case why == nil:
		c.Backend, c.CUDADevices = CUDA, n
	case name == CUDA:
		return Choice{}, fmt.Errorf("backend cuda requested but unavailable: %w", why)
	default:
		c.Fallback = why.Error()
	}
	return c, nil
}

// Open opens device ordinal of the named backend. simCfg configures the
// simulation when sim is used; the simulation has a single device, ordinal 0.
// log may be nil. When auto falls back to sim it logs why, once, at Info.
func Open(name string, ordinal int, simCfg sim.Config, log *zap.Logger) (device.Device, error) {
	if log == nil {
		log = zap.NewNop()
	}
	c, err := Choose(name)
	if err != nil {
		return nil, err
	}
	switch c.Backend {
	case CUDA:
		d, err := cuda.Open(ordinal)
		if err != nil {
			return nil, fmt.Errorf("backend cuda: %w", err)
		}
		return d, nil
	default:
		if ordinal != 0 {
			return nil, fmt.Errorf("backend sim: device ordinal %d out of range: the simulation has one device (ordinal 0)", ordinal)
		}
		d, err := sim.New(simCfg)
		if err != nil {
			return nil, fmt.Errorf("backend sim: %w", err)
		}
		if c.Fallback != "" {
			cfg := d.Config()
			log.Info("backend auto: CUDA not usable, using the host-memory simulation",
				zap.String("reason", c.Fallback),
				zap.Uint64("sim_capacity", cfg.Capacity),
				zap.Uint64("sim_granularity", cfg.Granularity))
		}
		return d, nil
	}
}

// DeviceCount returns the number of devices the named backend offers: the CUDA
// device count for cuda, 1 for sim, and for auto whichever Open would use.
func DeviceCount(name string) (int, error) {
	c, err := Choose(name)
	if err != nil {
		return 0, err
	}
	if c.Backend == Sim {
		return 1, nil
	}
	return c.CUDADevices, nil
}
