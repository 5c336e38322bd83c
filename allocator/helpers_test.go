package allocator

import "github.com/memscale/memscale/device"

func ptr(p uint64) device.Ptr { return device.Ptr(p) }
