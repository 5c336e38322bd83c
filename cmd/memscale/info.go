package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/memscale/memscale/device/backend"
	"github.com/memscale/memscale/device/cuda"
	"github.com/memscale/memscale/device/sim"
	"github.com/memscale/memscale/internal/bytesize"
)

func init() {
	register(command{
		name:    "info",
		summary: "show GPUs (via NVML), the CUDA driver, the backend auto would choose and the sim config",
		run: func(args []string, stdout, stderr io.Writer) error {
			return infoCommand(args, stdout, probeSystem)
		},
	})
}

// gpuInfo is one GPU as NVML reports it.
type gpuInfo struct {
	Index       int    `json:"index"`
	Name        string `json:"name"`
	MemoryTotal uint64 `json:"memory_total"`
	MemoryUsed  uint64 `json:"memory_used"`
	MemoryFree  uint64 `json:"memory_free"`
	PCIeGen     int    `json:"pcie_link_gen,omitempty"`
	PCIeWidth   int    `json:"pcie_link_width,omitempty"`
	// Errors lists the queries that failed for this GPU.
	Errors []string `json:"errors,omitempty"`
}

// nvmlInfo is what NVML says.
type nvmlInfo struct {
	Present       bool      `json:"present"`
	Error         string    `json:"error,omitempty"`
	DriverVersion string    `json:"driver_version,omitempty"`
	Devices       []gpuInfo `json:"devices"`
}

// cudaInfo is what the CUDA driver says.
type cudaInfo struct {
	Present       bool   `json:"present"`
	Error         string `json:"error,omitempty"`
	DriverVersion int    `json:"driver_version,omitempty"`
	Devices       int    `json:"devices"`
}

// backendInfo is the backend selection.
type backendInfo struct {
	// Env is the value of MEMSCALE_BACKEND ("" when unset).
	Env string `json:"env"`
	// Auto is what "auto" resolves to, and AutoFallback why it is sim.
	Auto         string `json:"auto"`
	AutoFallback string `json:"auto_fallback,omitempty"`
	// Selected is what MEMSCALE_BACKEND resolves to (auto when unset), or
	// SelectedError why it cannot be used.
	Selected      string `json:"selected,omitempty"`
	SelectedError string `json:"selected_error,omitempty"`
}

// simInfo is the simulation's default configuration.
type simInfo struct {
	Capacity      uint64  `json:"capacity"`
	Granularity   uint64  `json:"granularity"`
	CopyBandwidth float64 `json:"copy_bandwidth"`
	// CapacityEnv is MEMSCALE_SIM_CAPACITY as set (libmemscale parses it).
	CapacityEnv string `json:"capacity_env,omitempty"`
}

// infoReport is the output of `memscale info`.
type infoReport struct {
	NVML    nvmlInfo    `json:"nvml"`
	CUDA    cudaInfo    `json:"cuda"`
	Backend backendInfo `json:"backend"`
	Sim     simInfo     `json:"sim"`
}

// infoCommand runs `memscale info`; probe gathers the facts (tests pass a
// fake).
func infoCommand(args []string, stdout io.Writer, probe func() infoReport) error {
	fs := newFlagSet("info", "info [--json]", stdout)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("info takes no arguments, got %q", fs.Args())
	}
	r := probe()
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("writing JSON: %w", err)
		}
		return nil
	}
	return writeInfo(stdout, r)
}

// probeSystem gathers the report from this machine.
func probeSystem() infoReport {
	var r infoReport
	r.NVML = probeNVML()

	if err := cuda.Available(); err != nil {
		r.CUDA.Error = err.Error()
	} else {
		r.CUDA.Present = true
		if v, err := cuda.DriverVersion(); err == nil {
			r.CUDA.DriverVersion = v
		}
		if n, err := cuda.DeviceCount(); err != nil {
			r.CUDA.Error = err.Error()
		} else {
			r.CUDA.Devices = n
		}
	}

	r.Backend.Env = os.Getenv("MEMSCALE_BACKEND")
	if c, err := backend.Choose(backend.Auto); err == nil {
		r.Backend.Auto, r.Backend.AutoFallback = c.Backend, c.Fallback
	}
	if c, err := backend.Choose(r.Backend.Env); err != nil {
		r.Backend.SelectedError = err.Error()
	} else {
		r.Backend.Selected = c.Backend
	}

	r.Sim = simInfo{
		Capacity:    sim.DefaultCapacity,
		Granularity: sim.DefaultGranularity,
		CapacityEnv: os.Getenv("MEMSCALE_SIM_CAPACITY"),
	}
	return r
}

// probeNVML lists the GPUs through NVML. After a failed nvml.Init no other
// NVML function is called (not even Return.Error, which may call into the
// library): that can kill the process.
func probeNVML() nvmlInfo {
	info := nvmlInfo{Devices: []gpuInfo{}}
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		info.Error = fmt.Sprintf("nvml.Init: %s", nvmlReturnName(ret))
		return info
	}
	defer nvml.Shutdown()
	info.Present = true
	if v, ret := nvml.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		info.DriverVersion = v
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		info.Error = fmt.Sprintf("nvml.DeviceGetCount: %v", ret.Error())
		return info
	}
	for i := 0; i < n; i++ {
		g := gpuInfo{Index: i}
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			g.Errors = append(g.Errors, fmt.Sprintf("DeviceGetHandleByIndex: %v", ret.Error()))
			info.Devices = append(info.Devices, g)
			continue
		}
		if name, ret := dev.GetName(); ret == nvml.SUCCESS {
			g.Name = name
		} else {
			g.Errors = append(g.Errors, fmt.Sprintf("GetName: %v", ret.Error()))
		}
		if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemoryTotal, g.MemoryUsed, g.MemoryFree = mem.Total, mem.Used, mem.Free
		} else {
			g.Errors = append(g.Errors, fmt.Sprintf("GetMemoryInfo: %v", ret.Error()))
		}
		if gen, ret := dev.GetCurrPcieLinkGeneration(); ret == nvml.SUCCESS {
			g.PCIeGen = gen
		} else {
			g.Errors = append(g.Errors, fmt.Sprintf("GetCurrPcieLinkGeneration: %v", ret.Error()))
		}
		if width, ret := dev.GetCurrPcieLinkWidth(); ret == nvml.SUCCESS {
			g.PCIeWidth = width
		} else {
			g.Errors = append(g.Errors, fmt.Sprintf("GetCurrPcieLinkWidth: %v", ret.Error()))
		}
		info.Devices = append(info.Devices, g)
	}
	return info
}

// nvmlReturnName names the results nvml.Init can give without asking the
// library.
func nvmlReturnName(r nvml.Return) string {
	switch r {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "ERROR_LIBRARY_NOT_FOUND (libnvidia-ml.so.1 not found: no NVIDIA driver installed)"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "ERROR_DRIVER_NOT_LOADED (the NVIDIA kernel driver is not running)"
	case nvml.ERROR_NO_PERMISSION:
		return "ERROR_NO_PERMISSION"
	case nvml.ERROR_FUNCTION_NOT_FOUND:
		return "ERROR_FUNCTION_NOT_FOUND (libnvidia-ml.so.1 too old)"
	case nvml.ERROR_UNINITIALIZED:
		return "ERROR_UNINITIALIZED"
	case nvml.ERROR_UNKNOWN:
		return "ERROR_UNKNOWN"
	}
	return fmt.Sprintf("NVML error %d", int(r))
}

// writeInfo prints the report for people.
func writeInfo(w io.Writer, r infoReport) error {
	var werr error
	p := func(format string, args ...any) {
		if _, err := fmt.Fprintf(w, format, args...); err != nil && werr == nil {
			werr = fmt.Errorf("writing the report: %w", err)
		}
	}
	if r.NVML.Present {
		p("NVML: driver %s, %d GPU(s)\n", r.NVML.DriverVersion, len(r.NVML.Devices))
		if r.NVML.Error != "" {
			p("  error: %s\n", r.NVML.Error)
		}
		for _, g := range r.NVML.Devices {
			p("GPU %d: %s\n", g.Index, g.Name)
			p("  memory: total %s, used %s, free %s\n", bytesHuman(g.MemoryTotal), bytesHuman(g.MemoryUsed), bytesHuman(g.MemoryFree))
			if g.PCIeGen > 0 || g.PCIeWidth > 0 {
				p("  PCIe link: gen %d x%d\n", g.PCIeGen, g.PCIeWidth)
			}
			for _, e := range g.Errors {
				p("  error: %s\n", e)
			}
		}
	} else {
		p("NVML: not present: %s\n", r.NVML.Error)
	}
	if r.CUDA.Present {
		p("CUDA driver: version %d.%d, %d device(s)\n", r.CUDA.DriverVersion/1000, r.CUDA.DriverVersion%1000/10, r.CUDA.Devices)
		if r.CUDA.Error != "" {
			p("  error: %s\n", r.CUDA.Error)
		}
	} else {
		p("CUDA driver: not present: %s\n", r.CUDA.Error)
	}
	if r.Backend.AutoFallback != "" {
		p("backend auto: %s (CUDA not usable: %s)\n", r.Backend.Auto, r.Backend.AutoFallback)
	} else {
		p("backend auto: %s\n", r.Backend.Auto)
	}
	env := r.Backend.Env
	if env == "" {
		env = "(unset = auto)"
	}
	if r.Backend.SelectedError != "" {
		p("MEMSCALE_BACKEND=%s: error: %s\n", env, r.Backend.SelectedError)
	} else {
		p("MEMSCALE_BACKEND=%s: %s\n", env, r.Backend.Selected)
	}
	bw := "instant"
	if r.Sim.CopyBandwidth > 0 {
		bw = fmt.Sprintf("%s/s", bytesHuman(uint64(r.Sim.CopyBandwidth)))
	}
	p("sim: capacity %s, granularity %s, copy bandwidth %s", bytesHuman(r.Sim.Capacity), bytesHuman(r.Sim.Granularity), bw)
	if r.Sim.CapacityEnv != "" {
		p(" (defaults; MEMSCALE_SIM_CAPACITY=%s applies in libmemscale)", r.Sim.CapacityEnv)
	}
	p("\n")
	return werr
}

// bytesHuman formats a byte count with a binary unit and one decimal.
func bytesHuman(n uint64) string { return bytesize.Format(n, 1) }
