package nativemodel

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// The constants of c10/cuda/CUDACachingAllocator.cpp.
const (
	// KMinBlockSize: every request is rounded up to a multiple of 512 bytes.
	KMinBlockSize = 512
	// KSmallSize: rounded requests up to 1 MiB come from the small pool.
	KSmallSize = 1 << 20
	// KSmallBuffer: the small pool's segments (and expandable chunks) are 2 MiB.
	KSmallBuffer = 2 << 20
	// KLargeBuffer: requests between 1 and 10 MiB get 20 MiB segments; the
	// large pool's expandable chunks are 20 MiB.
	KLargeBuffer = 20 << 20
	// KMinLargeAlloc: from 10 MiB on, a segment is the request rounded up to 2 MiB.
	KMinLargeAlloc = 10 << 20
	// KRoundLarge is that rounding.
	KRoundLarge = 2 << 20
	// roundupIntervals is the number of power-of-two size intervals (1 MiB
	// to 64 GiB) of roundup_power2_divisions.
	roundupIntervals = 16
)

// Config is the part of PYTORCH_CUDA_ALLOC_CONF the model follows.
type Config struct {
	// MaxSplitSize is max_split_size_mb in bytes; 0 means unlimited (the default).
	MaxSplitSize uint64
	// RoundupPower2Divisions holds roundup_power2_divisions per size
	// interval: index 0 for sizes below 2 MiB, i for [2^(20+i), 2^(21+i)),
	// the last for everything above. 0 or 1 means plain 512-byte rounding.
	RoundupPower2Divisions [roundupIntervals]uint64
	// ExpandableSegments is expandable_segments:True.
	ExpandableSegments bool
	// Capacity is the device memory in bytes: cudaMalloc (or mapping a
	// chunk of an expandable segment) fails when reserved memory would pass
	// it. 0 means unlimited.
	Capacity uint64
}

// maxSplit is max_split_size as the allocator uses it (SIZE_MAX when unset).
func (c *Config) maxSplit() uint64 {
	if c.MaxSplitSize == 0 {
		return math.MaxUint64
	}
	return c.MaxSplitSize
}

// ParseConf parses PYTORCH_CUDA_ALLOC_CONF syntax: comma-separated key:value
// pairs. Accepted keys: max_split_size_mb (> 20), roundup_power2_divisions
// (one power of two, or a list [256:1,512:2,>:4] keyed by MiB),
// expandable_segments (True/False) and backend:native. Other keys are
// rejected by name, since the model does not follow them.
func ParseConf(s string) (Config, error) {
	var c Config
	s = strings.TrimSpace(s)
	if s == "" {
		return c, nil
	}
	for _, kv := range splitTop(s) {
		k, v, ok := strings.Cut(kv, ":")
		if !ok {
			return c, fmt.Errorf("nativemodel: %q: want key:value (e.g. expandable_segments:True)", kv)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "max_split_size_mb":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return c, fmt.Errorf("nativemodel: max_split_size_mb:%s: not a whole number of MiB", v)
			}
			if n <= KLargeBuffer>>20 {
				return c, fmt.Errorf("nativemodel: max_split_size_mb:%s too small, must be > %d (as in PyTorch)", v, KLargeBuffer>>20)
			}
			c.MaxSplitSize = n << 20
		case "roundup_power2_divisions":
			d, err := parseDivisions(v)
			if err != nil {
				return c, fmt.Errorf("nativemodel: roundup_power2_divisions:%s: %w", v, err)
			}
			c.RoundupPower2Divisions = d
		case "expandable_segments":
			switch v {
			case "True":
				c.ExpandableSegments = true
			case "False":
				c.ExpandableSegments = false
			default:
				return c, fmt.Errorf("nativemodel: expandable_segments:%s: want True or False", v)
			}
		case "backend":
			if v != "native" {
				return c, fmt.Errorf("nativemodel: backend:%s: only the native caching allocator is modelled (backend:native)", v)
			}
		default:
			return c, fmt.Errorf("nativemodel: %s: not modelled (accepted: max_split_size_mb, roundup_power2_divisions, expandable_segments, backend:native)", k)
		}
	}
	return c, nil
}

// splitTop splits at commas outside brackets.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// parseDivisions parses roundup_power2_divisions as PyTorch's
// CUDAAllocatorConfig does: one value for every interval, or a list of
// MiB:divisions entries (">" = every interval after the last one named; the
// first entry also fills the intervals below it).
func parseDivisions(v string) ([roundupIntervals]uint64, error) {
	var d [roundupIntervals]uint64
	pow2 := func(n uint64) bool { return n > 0 && n&(n-1) == 0 }
	if !strings.HasPrefix(v, "[") {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || (n != 0 && !pow2(n)) {
			return d, fmt.Errorf("want a power of two or a list like [256:1,512:2,>:4]")
		}
		for i := range d {
			d[i] = n
		}
		return d, nil
	}
	if !strings.HasSuffix(v, "]") {
		return d, fmt.Errorf("unclosed list")
	}
	first, last := true, 0
	for _, e := range strings.Split(v[1:len(v)-1], ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(e), ":")
		if !ok {
			return d, fmt.Errorf("entry %q: want MiB:divisions", e)
		}
		n, err := strconv.ParseUint(strings.TrimSpace(val), 10, 64)
		if err != nil || (n != 0 && !pow2(n)) {
			return d, fmt.Errorf("entry %q: divisions must be a power of two", e)
		}
		if strings.TrimSpace(k) == ">" {
			for i := last + 1; i < roundupIntervals; i++ {
				d[i] = n
			}
			continue
		}
		mb, err := strconv.ParseUint(strings.TrimSpace(k), 10, 64)
		if err != nil || !pow2(mb) {
			return d, fmt.Errorf("entry %q: the size must be a power of two in MiB", e)
		}
		idx := min(bits.Len64(mb)-1, roundupIntervals-1)
		if first {
			for i := 0; i < idx; i++ {
				d[i] = n
			}
			first = false
		}
		d[idx] = n
		last = idx
	}
	return d, nil
}

// divisions is roundup_power2_divisions(size).
func (c *Config) divisions(size uint64) uint64 {
	logSize := bits.Len64(size) - 1
	idx := 0
	if logSize > 20 {
		idx = min(logSize-20, roundupIntervals-1)
	}
	return c.RoundupPower2Divisions[idx]
}

// RoundSize is the allocator's round_size: at least 512 bytes, then either
// the next power-of-two division (roundup_power2_divisions) or the next
// multiple of 512.
func (c *Config) RoundSize(size uint64) uint64 {
	if size < KMinBlockSize {
		return KMinBlockSize
	}
	if div := c.divisions(size); div > 1 && size > KMinBlockSize*div {
		return roundupPower2NextDivision(size, div)
	}
	return (size + KMinBlockSize - 1) / KMinBlockSize * KMinBlockSize
}

// roundupPower2NextDivision rounds size up to the next of div equal steps
// between the powers of two around it.
func roundupPower2NextDivision(size, div uint64) uint64 {
	if size&(size-1) == 0 {
		return size
	}
	floor := uint64(1) << (bits.Len64(size) - 1)
	step := floor >> (bits.Len64(div) - 1)
	if step == 0 {
		return floor << 1
	}
	rf := size &^ (step - 1)
	if rf == size {
		return size
	}
	return rf + step
}

// AllocationSize is get_allocation_size: the segment cudaMalloc'd for a
// rounded request that the cache cannot serve.
func AllocationSize(size uint64) uint64 {
	switch {
	case size <= KSmallSize:
		return KSmallBuffer
	case size < KMinLargeAlloc:
		return KLargeBuffer
	}
	return (size + KRoundLarge - 1) / KRoundLarge * KRoundLarge
}

// String renders c in PYTORCH_CUDA_ALLOC_CONF syntax ("" for the default).
func (c Config) String() string {
	var parts []string
	if c.MaxSplitSize != 0 {
		parts = append(parts, fmt.Sprintf("max_split_size_mb:%d", c.MaxSplitSize>>20))
	}
	uniform := true
	for _, d := range c.RoundupPower2Divisions {
		uniform = uniform && d == c.RoundupPower2Divisions[0]
	}
	switch {
	case uniform && c.RoundupPower2Divisions[0] > 1:
		parts = append(parts, fmt.Sprintf("roundup_power2_divisions:%d", c.RoundupPower2Divisions[0]))
	case !uniform:
		var es []string
		for i, d := range c.RoundupPower2Divisions {
			es = append(es, fmt.Sprintf("%d:%d", 1<<i, d))
		}
		parts = append(parts, "roundup_power2_divisions:["+strings.Join(es, ",")+"]")
	}
	if c.ExpandableSegments {
		parts = append(parts, "expandable_segments:True")
	}
	return strings.Join(parts, ",")
}
