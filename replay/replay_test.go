package replay

import (
	"fmt"
	"strings"
	"testing"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/sharedtraces"
	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Ratios are the budget ratios of the sweep.
var sweepRatios = []float64{0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}

// referenceTable is REFERENCE.md section 5's table (simrd,
// RuntimeV2EagerOptimized): "" = no entry, "oom", ">2x", or the overhead.
var referenceTable = map[string]map[float64]map[evict.Heuristic]string{
	"resnet32": {
		0.2: {evict.DTR: "1.371", evict.DTREq: "1.332", evict.MSPS: "1.431", evict.LRU: ">2x", evict.Size: ">2x"},
		0.4: {evict.DTR: "1.140", evict.DTREq: "1.140", evict.MSPS: "1.146", evict.LRU: ">2x", evict.Size: "1.738"},
		0.6: {evict.DTR: "1.074", evict.DTREq: "1.074", evict.MSPS: "1.063", evict.LRU: "1.130", evict.Size: "1.234"},
		0.8: {evict.DTR: "1.025", evict.DTREq: "1.025", evict.MSPS: "1.024", evict.LRU: "1.067", evict.Size: "1.065"},
	},
	"tv_densenet121": {
		0.2: {evict.DTR: "1.679", evict.DTREq: "1.616", evict.MSPS: "1.465", evict.LRU: ">2x", evict.Size: ">2x"},
		0.4: {evict.DTR: "1.271", evict.DTREq: "1.293", evict.MSPS: "1.232", evict.LRU: ">2x", evict.Size: ">2x"},
		0.6: {evict.DTR: "1.141", evict.DTREq: "1.141", evict.MSPS: "1.114", evict.LRU: ">2x", evict.Size: "1.211"},
		0.8: {evict.DTR: "1.064", evict.DTREq: "1.064", evict.MSPS: "1.053", evict.LRU: "1.062", evict.Size: "1.074"},
	},
	"transformer": {
		0.2: {evict.DTR: "1.352", evict.DTREq: "1.545", evict.MSPS: "1.333", evict.LRU: ">2x", evict.Size: ">2x"},
		0.4: {evict.DTR: "1.083", evict.DTREq: "1.091", evict.MSPS: "1.089", evict.LRU: ">2x", evict.Size: "1.080"},
		0.6: {evict.DTR: "1.044", evict.DTREq: "1.044", evict.MSPS: "1.048", evict.LRU: "1.134", evict.Size: "1.053"},
		0.8: {evict.DTR: "1.020", evict.DTREq: "1.020", evict.MSPS: "1.018", evict.LRU: "1.065", evict.Size: "1.028"},
	},
	"lstm": {
		0.2: {evict.DTR: "1.598", evict.DTREq: "1.550", evict.MSPS: ">2x", evict.LRU: "oom", evict.Size: ">2x"},
		0.4: {evict.DTR: "1.143", evict.DTREq: "1.159", evict.MSPS: "1.121", evict.LRU: ">2x", evict.Size: ">2x"},
		0.6: {evict.DTR: "1.042", evict.DTREq: "1.042", evict.MSPS: "1.057", evict.LRU: ">2x", evict.Size: ">2x"},
		0.8: {evict.DTR: "1.028", evict.DTREq: "1.027", evict.MSPS: "1.031", evict.LRU: "1.086", evict.Size: ">2x"},
	},
	"unet": {
		0.3: {evict.DTR: "oom", evict.DTREq: "oom", evict.MSPS: "1.585", evict.LRU: ">2x", evict.Size: "oom"},
		0.4: {evict.DTR: "oom", evict.DTREq: "oom", evict.MSPS: "1.241", evict.LRU: "oom", evict.Size: "oom"},
		0.5: {evict.DTR: "1.159", evict.DTREq: "1.159", evict.MSPS: "1.132", evict.LRU: ">2x", evict.Size: "1.659"},
		0.6: {evict.DTR: "1.131", evict.DTREq: "1.149", evict.MSPS: "1.088", evict.LRU: "1.225", evict.Size: "1.592"},
		0.8: {evict.DTR: "1.058", evict.DTREq: "1.058", evict.MSPS: "1.033", evict.LRU: "1.062", evict.Size: "1.128"},
	},
}

// cell formats a result the way the reference table does.
func cell(r Result) string { return r.Short() }

// TestReproducesReferenceTable replays every cell of the reference table in
// simulator mode and requires the same outcome to three decimals. In -short
// mode the slow e* and MSPS runs of the three big traces are skipped.
func TestReproducesReferenceTable(t *testing.T) {
	for _, tc := range sharedtraces.ForTest(t) {
		t.Run(tc.Name, func(t *testing.T) {
			table, ok := referenceTable[tc.Name]
			require.True(t, ok)
			tr := loadTrace(t, tc.Path)
			base, err := Run(tr, Options{})
			require.NoError(t, err)
			for ratio, row := range table {
				for h, want := range row {
					slow := (h == evict.DTR || h == evict.MSPS) && tc.Name != "resnet32" && tc.Name != "unet"
					if testing.Short() && slow {
						continue
					}
					res, err := Run(tr, Options{
						Budget: Budget(ratio, base.Peak),
						Engine: evict.Config{Heuristic: h, SimulatorCompat: true},
					})
					require.NoError(t, err)
					assert.Equal(t, want, cell(res), "%s ratio %.1f %s", tc.Name, ratio, h)
				}
			}
		})
	}
}

// TestInvariantsEveryRatio replays every trace at every ratio with the
// default engine and with the plan-based rebuild, checking the invariants
// after every instruction (usage within budget, byte counts, op inputs
// resident).
func TestInvariantsEveryRatio(t *testing.T) {
	for _, tc := range sharedtraces.ForTest(t) {
		t.Run(tc.Name, func(t *testing.T) {
			tr := loadTrace(t, tc.Path)
			base, err := Run(tr, Options{})
			require.NoError(t, err)
			for _, plans := range []bool{false, true} {
				for _, ratio := range sweepRatios {
					res, err := Run(tr, Options{Budget: Budget(ratio, base.Peak), Check: true, Plans: plans})
					require.NoError(t, err, "ratio %.1f plans=%v", ratio, plans)
					if res.Status == OK {
						assert.LessOrEqual(t, res.Peak, Budget(ratio, base.Peak))
						assert.GreaterOrEqual(t, res.Overhead, 1.0)
						assert.Equal(t, tr.Len(), res.Instructions)
					} else {
						assert.NotEmpty(t, res.Reason)
					}
				}
			}
		})
	}
}

// chainTrace is an n-layer chain trained for one step (forward keeping
// every activation, backward releasing them in reverse).
func chainTrace(n int, size int) string {
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	out := func(name string, mem int) {
		line(`{"INSTRUCTION":"MEMORY","NAME":%q,"MEMORY":"%d"}`, name, mem)
		line(`{"INSTRUCTION":"ALIAS","NAME":%q,"ALIAS":"-1"}`, name)
	}
	line(`{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}`)
	line(`{"INSTRUCTION":"CONSTANT","NAME":"a0"}`)
	line(`{"INSTRUCTION":"MEMORY","NAME":"a0","MEMORY":"%d"}`, size)
	for i := 1; i <= n; i++ {
		line(`{"INSTRUCTION":"CALL","NAME":"layer","ARGS":["a%d"],"RESULT":["a%d"],"TIME":"%d"}`, i-1, i, 1000*i)
		out(fmt.Sprintf("a%d", i), size)
	}
	line(`{"INSTRUCTION":"ANNOTATE","ANNOTATION":"BACKWARD"}`)
	line(`{"INSTRUCTION":"CALL","NAME":"loss_grad","ARGS":["a%d"],"RESULT":["g%d"],"TIME":"500"}`, n, n)
	out(fmt.Sprintf("g%d", n), size)
	line(`{"INSTRUCTION":"RELEASE","NAME":"a%d"}`, n)
	for i := n; i >= 1; i-- {
		line(`{"INSTRUCTION":"CALL","NAME":"layer_grad","ARGS":["g%d","a%d"],"RESULT":["g%d"],"TIME":"%d"}`, i, i-1, i-1, 1500*i)
		out(fmt.Sprintf("g%d", i-1), size)
		line(`{"INSTRUCTION":"RELEASE","NAME":"g%d"}`, i)
		if i > 1 {
			line(`{"INSTRUCTION":"RELEASE","NAME":"a%d"}`, i-1)
		}
	}
	return b.String()
}

func TestChainTrace(t *testing.T) {
	tr, err := rc.ReadTrace(strings.NewReader(chainTrace(20, 100)), rc.ParseOptions{})
	require.NoError(t, err)
	base, err := Run(tr, Options{})
	require.NoError(t, err)
	assert.Equal(t, uint64(22*100), base.Peak, "a0..a20 and g20")
	var sum int64
	for i := 1; i <= 20; i++ {
		sum += int64(1000*i + 1500*i)
	}
	assert.Equal(t, sum+500, base.Compute)
	for _, h := range evict.Heuristics() {
		for _, plans := range []bool{false, true} {
			res, err := Run(tr, Options{Budget: 800, Check: true, Plans: plans, Engine: evict.Config{Heuristic: h}})
			require.NoError(t, err)
			if res.Status == OK {
				assert.Greater(t, res.Rematerializations, int64(0), "%s", h)
				assert.LessOrEqual(t, res.Peak, uint64(800))
			}
		}
	}
	// too small to hold an op's inputs and output: out of memory
	res, err := Run(tr, Options{Budget: 250})
	require.NoError(t, err)
	assert.Equal(t, OOM, res.Status)
	assert.Contains(t, res.Reason, "nothing evictable")
	// an overhead limit stops a run that thrashes
	res, err = Run(tr, Options{Budget: 500, OverheadLimit: 1.01})
	require.NoError(t, err)
	assert.Equal(t, OverLimit, res.Status)
}

// stingyMemory places blocks in a counting model that loses 150 bytes of
// its capacity (the budget) to fragmentation: a block the budget allows may
// not fit, so the replay has to evict one more victim and retry.
type stingyMemory struct {
	used, peak, capacity uint64
	sizes                map[Block]uint64
	next                 Block
}

func (m *stingyMemory) Name() string               { return "stingy" }
func (m *stingyMemory) UsageSource() func() uint64 { return func() uint64 { return m.used } }
func (m *stingyMemory) Peak() uint64               { return m.peak }
func (m *stingyMemory) Alloc(size uint64, _ bool) (Block, error) {
	if m.used+size > m.capacity-150 {
		return 0, fmt.Errorf("%d bytes with %d in use: %w", size, m.used, ErrNoRoom)
	}
	m.next++
	m.sizes[m.next] = size
	m.used += size
	m.peak = max(m.peak, m.used)
	return m.next, nil
}
func (m *stingyMemory) Free(b Block) error {
	s, ok := m.sizes[b]
	if !ok {
		return fmt.Errorf("unknown block %d", b)
	}
	delete(m.sizes, b)
	m.used -= s
	return nil
}

func TestPlacingMemoryModel(t *testing.T) {
	tr, err := rc.ReadTrace(strings.NewReader(chainTrace(20, 100)), rc.ParseOptions{})
	require.NoError(t, err)
	m := &stingyMemory{capacity: 900, sizes: map[Block]uint64{}}
	res, err := Run(tr, Options{Budget: 900, Memory: m})
	require.NoError(t, err)
	require.Equal(t, OK, res.Status, res.Reason)
	assert.Equal(t, "stingy", res.Memory)
	assert.LessOrEqual(t, res.Peak, uint64(900))
	assert.Greater(t, res.Evictions, int64(0))
}
