package planner

import (
	"fmt"
	"sort"
	"strings"
)

// Device is a GPU of the planner's table: its memory and the peak rates the
// cost model of memscale.plan (Python, pytorch_plugin/memscale/plan/costs.py,
// which holds the same table) divides an op's FLOPs and bytes by.
type Device struct {
	// Key is what --device takes ("h100").
	Key string `json:"key"`
	// Name is the product's name.
	Name string `json:"name"`
	// Memory is the card's memory in bytes, as CUDA reports it (below what
	// nvidia-smi prints).
	Memory uint64 `json:"memory_bytes"`
	// DenseBF16 and FP32 are the peak dense tensor-core (bf16/fp16) and
	// fp32 rates in FLOP/s; Bandwidth is the memory bandwidth in bytes/s.
	DenseBF16 float64 `json:"bf16_flops"`
	FP32      float64 `json:"fp32_flops"`
	Bandwidth float64 `json:"bandwidth_bytes_per_s"`
}

// Reserve is the memory of a card a training step cannot use: the CUDA
// context, cuBLAS/cuDNN workspaces and the caching allocator's slack.
const Reserve = 1 << 30

// Usable is the device's memory less Reserve.
func (d Device) Usable() uint64 {
	if d.Memory <= Reserve {
		return 0
	}
	return d.Memory - Reserve
}

const mib = 1 << 20

// devices is the table: memory as CUDA reports it (MiB) where a GPU run of
// bench/gpu measured it (torch's total_memory: the H100 80GB HBM3 79.18 GiB,
// the H200 139.80 GiB, 0.47 and 0.60 GiB below what nvidia-smi prints:
// bench/results/planner.md), else from nvidia-smi; rates from the vendors'
// data sheets (SXM parts, dense, no sparsity).
var devices = []Device{
	{Key: "h100", Name: "H100 80GB", Memory: 81080 * mib, DenseBF16: 989e12, FP32: 67e12, Bandwidth: 3.35e12},
	{Key: "h200", Name: "H200 141GB", Memory: 143155 * mib, DenseBF16: 989e12, FP32: 67e12, Bandwidth: 4.8e12},
	{Key: "a100-40gb", Name: "A100 40GB", Memory: 40960 * mib, DenseBF16: 312e12, FP32: 19.5e12, Bandwidth: 1.555e12},
	{Key: "a100-80gb", Name: "A100 80GB", Memory: 81920 * mib, DenseBF16: 312e12, FP32: 19.5e12, Bandwidth: 2.039e12},
	{Key: "l4", Name: "L4 24GB", Memory: 23034 * mib, DenseBF16: 121e12, FP32: 30.3e12, Bandwidth: 300e9},
	{Key: "rtx4090", Name: "RTX 4090 24GB", Memory: 24564 * mib, DenseBF16: 165e12, FP32: 82.6e12, Bandwidth: 1.008e12},
}

// aliases are other names --device accepts.
var aliases = map[string]string{"a100": "a100-80gb", "a100-40": "a100-40gb", "a100-80": "a100-80gb", "4090": "rtx4090", "rtx-4090": "rtx4090"}

// Devices returns the device table.
func Devices() []Device { return append([]Device(nil), devices...) }

// DeviceKeys lists the keys --device accepts, sorted.
func DeviceKeys() []string {
	keys := make([]string, 0, len(devices))
	for _, d := range devices {
		keys = append(keys, d.Key)
	}
	sort.Strings(keys)
	return keys
}

// LookupDevice finds a device by key or alias, case-insensitively.
func LookupDevice(name string) (Device, error) {
	k := strings.ToLower(strings.TrimSpace(name))
	if a, ok := aliases[k]; ok {
		k = a
	}
	for _, d := range devices {
		if d.Key == k {
			return d, nil
		}
	}
	return Device{}, fmt.Errorf("unknown device %q (known: %s)", name, strings.Join(DeviceKeys(), ", "))
}

// ParseDevices parses a comma list of device names ("" = none; "all" =
// the whole table).
func ParseDevices(s string) ([]Device, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	if strings.EqualFold(s, "all") {
		return Devices(), nil
	}
	var out []Device
	for _, item := range strings.Split(s, ",") {
		d, err := LookupDevice(item)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}
