package main

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzABI drives the exports the way a careless caller could: mallocs of any
// size (negative, zero, huge), frees of live, freed, interior and made-up
// pointers with right and wrong sizes, record_stream, empty_cache, and the DTR
// engine's calls with ids and handles that exist and ids and handles that do
// not: evict and reclaim with negative, small and huge extra or need and any
// cap, plan with too small a cap, finish (twice), status_of, set_budget,
// stats_json; and set_reclaimer with NULL and with reclaimers that cannot
// help (returning 0 or a negative count), on devices that exist, cannot be
// opened or are out of range. However wrong the input, no call may panic
// (guard would record "internal error (panic)"), the allocator must account
// exactly for what is live, freeing what is live must bring it back to
// zero, and destroying the engine must free its status block.
func FuzzABI(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 0, 1, 1, 2, 3, 4, 6, 7, 8, 10, 11})
	f.Add([]byte("\x00\x10\x00\x00\x00\x02\x05\x06\x07\x07\x0a\x0b\x08\x0a"))
	f.Add([]byte{0, 255, 255, 255, 255, 2, 9, 9, 9, 5, 0, 0, 0, 16, 0, 1})
	f.Fuzz(fuzzABIOnce)
}

// TestABIRandomInputs runs FuzzABI's body on seeded random inputs, one after
// another in one process (the library's state carries over, as in a host).
func TestABIRandomInputs(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	n := 3000
	if testing.Short() {
		n = 300
	}
	for range n {
		data := make([]byte, rng.IntN(400))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		fuzzABIOnce(t, data)
	}
}

// fuzzReclaimers are the reclaimers FuzzABI installs: they free nothing
// (one returns 0, the other -5), so the fuzz target's accounting holds.
// They are never freed: an input may leave one set for a device that never
// opens until the next input removes it.
var fuzzReclaimers = sync.OnceValue(func() [2]*testReclaimer {
	return [2]*testReclaimer{newTestReclaimer(reclaimZero, 0), newTestReclaimer(reclaimNegative, 0)}
})

func fuzzABIOnce(t *testing.T, data []byte) {
	require.Zero(t, abiAllocated(0), "a previous input leaked")
	defer func() { // no reclaimer outlives the input
		for dev := range maxDevices {
			abiSetReclaimer(dev, nil)
		}
	}()
	blocks := liveStatusBlocks.Load()
	r := fuzzReader{data: data}
	var lives []liveBlock
	var freed []uintptr
	auto := r.u8()%2 == 0
	policy := ""
	if auto {
		policy = `, "heuristic": "auto"`
	}
	h := abiDTRCreate(`{"budget": ` + itoa(int64(r.u16())*64) + `, "usage": "engine"` + policy + `}`)
	require.Positive(t, h, lastError())
	status, _ := abiDTRStatus(h)
	require.NotZero(t, status, lastError())
	handle := func() int64 { // mostly h, sometimes a handle that does not exist
		if r.u8()%8 == 0 {
			return h + 1000 + int64(r.u8())
		}
		return h
	}
	var ids []int64
	pick := func() int64 {
		if len(ids) == 0 || r.u8()%8 == 0 {
			return int64(r.u16()) - 100 // often not an id at all
		}
		return ids[int(r.u8())%len(ids)]
	}
	for steps := 0; !r.done() && steps < 200; steps++ {
		switch r.u8() % 18 {
		case 0: // malloc, any size
			size := int64(r.u32()) >> (r.u8() % 40)
			if r.u8()%16 == 0 {
				size = -size - 1
			}
			if r.u8()%32 == 0 {
				size = 1 << 50
			}
			if p := abiMalloc(size, 0, uintptr(r.u8()%3)); p != 0 {
				lives = append(lives, liveBlock{p, size})
			}
		case 1: // free, right size
			if len(lives) > 0 {
				i := int(r.u8()) % len(lives)
				abiFree(lives[i].p, lives[i].size, 0, 0)
				freed = append(freed, lives[i].p)
				lives = append(lives[:i], lives[i+1:]...)
			}
		case 2: // free of a pointer that is not live: double, interior or made up
			var p uintptr
			switch {
			case len(freed) > 0 && r.u8()%2 == 0:
				p = freed[int(r.u8())%len(freed)]
			case len(lives) > 0 && r.u8()%2 == 0:
				p = lives[int(r.u8())%len(lives)].p + 512*uintptr(1+r.u8()%4)
			default:
				p = uintptr(r.u32())<<12 | 0x1000
			}
			if !isLive(p, lives) {
				before := abiAllocated(0)
				abiFree(p, int64(r.u16()), 0, 0)
				require.Equal(t, before, abiAllocated(0), "a bad free changed the allocation count")
			}
		case 3: // record_stream
			if len(lives) > 0 {
				abiRecordStream(lives[int(r.u8())%len(lives)].p, uintptr(r.u8()%4))
			}
		case 4:
			abiEmptyCache()
		case 5: // free with a wrong size: reported, still freed
			if len(lives) > 0 {
				i := int(r.u8()) % len(lives)
				abiFree(lives[i].p, lives[i].size+1, 0, 0)
				lives = append(lives[:i], lives[i+1:]...)
			}
		case 6:
			if id := abiDTRTensor(h, int64(r.u16())-8, int32(r.u8()%2)); id >= 0 {
				ids = append(ids, id)
			}
		case 7: // an op with inputs that may not exist and outputs of any size
			ins := make([]int64, r.u8()%4)
			for i := range ins {
				ins[i] = pick()
			}
			n := int(r.u8() % 4)
			sizes := make([]int64, n)
			alias := make([]int32, n)
			for i := range sizes {
				sizes[i] = int64(r.u16()) - 4
				alias[i] = int32(r.u8()%6) - 2
			}
			if op, outs := abiDTRCall(h, ins, sizes, alias, int64(r.u16()), int32(r.u8()%3)); op >= 0 {
				ids = append(ids, outs...)
			}
		case 8:
			abiDTRRelease(h, pick())
		case 9:
			if t0 := pick(); r.u8()%2 == 0 {
				abiDTRLock(h, t0)
			} else {
				abiDTRUnlock(h, t0)
			}
		case 10: // evict with any extra (negative, within or over the budget) and cap
			extra := int64(r.u16()) - 64
			if r.u8()%8 == 0 {
				extra = 1 << 40
			}
			if n, _ := abiDTREvict(handle(), extra, int32(r.u8()%5)); n >= 0 {
				require.GreaterOrEqual(t, extra, int64(0), "a negative extra must fail")
			}
		case 11: // plan with a cap that may be too small, then again with room, reporting the re-runs as a caller would
			tid := pick()
			before := errorCount()
			capacity := int32(r.u8()%4) - 1
			n, kinds, steps := abiDTRPlan(h, tid, capacity)
			if n > capacity && capacity >= 0 {
				require.Equal(t, before, errorCount(), "a plan longer than cap is not an error")
				require.Equal(t, n, abiDTRPlanCount(h, tid), "the count does not change between calls")
				n, kinds, steps = abiDTRPlan(h, tid, n)
			}
			for i := 0; i < len(kinds); i++ {
				if kinds[i] == 0 {
					abiDTRRematerialized(h, steps[i], int64(r.u8()))
				}
			}
		case 12:
			abiDTRFinish(handle())
		case 13:
			hh := handle()
			p, _ := abiDTRStatus(hh)
			if hh == h {
				require.Equal(t, status, p, "the status block stays where it is")
			} else {
				require.Zero(t, p)
				require.Contains(t, lastError(), "unknown engine handle")
			}
		case 14:
			abiDTRSetBudget(handle(), int64(r.u16())*64-128)
			if js := abiDTRStatsJSON(handle()); js != "" {
				require.Contains(t, js, `"config"`)
			}
		case 15: // set_reclaimer: NULL or one that cannot help, on any device
			dev := int(int8(r.u8()))
			var rec *testReclaimer
			if k := r.u8() % 3; k < 2 {
				rec = fuzzReclaimers()[k]
			}
			got := abiSetReclaimer(dev, rec)
			switch {
			case dev < 0 || dev >= maxDevices:
				require.Equal(t, -1, got, "device %d is out of range", dev)
				require.Contains(t, lastError(), "out of range")
			case dev == 0:
				require.Equal(t, 0, got, lastError())
			}
		case 17: // a batch of records whose ids and names may be predicted right or wrong
			name := abiDTRName(h, []string{"a", "b", "c"}[r.u8()%3])
			_, st := abiDTRStatus(h)
			records := make([]dtrRecord, r.u8()%4)
			op, next := st.NextOp, st.NextTensor
			for i := range records {
				rec := dtrRecord{name: name + int64(r.u8()%8/7), op: op, firstOut: next, cost: int64(r.u16()) - 4}
				if r.u8()%4 == 0 {
					rec.released = []int64{pick()}
				}
				if r.u8()%8 == 0 { // releases only
					rec.cost = 0
					rec.op, rec.firstOut = 0, 0
				} else {
					rec.inputs = []int64{pick()}
					n := int64(r.u8() % 3)
					for range n {
						rec.sizes = append(rec.sizes, int64(r.u16())-4)
						rec.alias = append(rec.alias, int64(r.u8()%4)-2)
					}
					if r.u8()%8 == 0 {
						rec.op++ // a wrong prediction
					}
					op++
					next += n
				}
				records[i] = rec
			}
			if n, freed := abiDTROps(handle(), records, int64(r.u8()%4)); n >= 0 {
				require.Equal(t, int64(len(records)), n)
				_, after := abiDTRStatus(h)
				require.Equal(t, op, after.NextOp, "every record applied with the ids it expected")
				require.Equal(t, next, after.NextTensor)
				for _, f := range freed {
					ids = append(ids, f[0]) // a freed storage's id, to be misused later
				}
			}
		case 16: // reclaim with any need (negative, small, huge) and cap
			need := int64(r.u16()) - 64
			if r.u8()%8 == 0 {
				need = 1 << 40
			}
			capacity := int32(r.u8()%5) - 1
			if n, victims := abiDTRReclaim(handle(), need, capacity); n >= 0 {
				require.GreaterOrEqual(t, need, int64(0), "a negative need must fail")
				require.Positive(t, capacity, "a cap <= 0 must fail")
				require.LessOrEqual(t, n, capacity)
				require.Len(t, victims, int(n))
			}
		}
		require.NotContains(t, lastError(), "internal error (panic)")
		var sum int64
		for _, l := range lives {
			sum += max(l.size, 0)
		}
		require.GreaterOrEqual(t, abiAllocated(0), sum, "live allocations not accounted for")
	}
	if js := abiDTRTune(h); js == "" {
		require.NotContains(t, lastError(), "panic")
		if !auto {
			require.Contains(t, lastError(), "does not record")
		}
	} else {
		require.True(t, auto, "a non-recording engine was tuned")
		require.Contains(t, js, `"config"`)
	}
	require.Equal(t, 0, abiDTRDestroy(h), lastError())
	require.Equal(t, blocks, liveStatusBlocks.Load(), "destroy frees the status block")
	p, _ := abiDTRStatus(h)
	require.Zero(t, p, "no status block after destroy")
	require.Equal(t, -1, abiDTRFinish(h))
	for _, l := range lives {
		abiFree(l.p, l.size, 0, 0)
	}
	require.Zero(t, abiAllocated(0), "freeing everything live must leave nothing allocated")
	require.False(t, strings.Contains(lastError(), "panic"), lastError())
}

// liveBlock is an allocation the fuzz target holds.
type liveBlock struct {
	p    uintptr
	size int64
}

func isLive(p uintptr, lives []liveBlock) bool {
	for _, l := range lives {
		if l.p == p {
			return true
		}
	}
	return false
}

func itoa(v int64) string {
	var b [20]byte
	i := len(b)
	if v == 0 {
		return "0"
	}
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}

// fuzzReader hands out the fuzz input's bytes as small integers, and zeros
// once the input is used up.
type fuzzReader struct {
	data []byte
	off  int
}

func (r *fuzzReader) done() bool { return r.off >= len(r.data) }

func (r *fuzzReader) u8() uint8 {
	if r.done() {
		return 0
	}
	r.off++
	return r.data[r.off-1]
}

func (r *fuzzReader) u16() uint16 { return binary.LittleEndian.Uint16([]byte{r.u8(), r.u8()}) }

func (r *fuzzReader) u32() uint32 { return uint32(r.u16()) | uint32(r.u16())<<16 }
