package sweep

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/replay"
)

// sampleReport is a small hand-made report.
func sampleReport() *Report {
	tr := &TraceReport{Name: "unet", Path: "/s/unet.log", Baseline: Baseline{Peak: 8 << 30, Compute: 435_000_000, Instructions: 1829},
		Runs: []RunResult{
			{Trace: "unet", Heuristic: "dtr", Ratio: 0.3, Budget: replay.Budget(0.3, 8<<30), Status: "oom", Reason: "nothing evictable", Overhead: 1.7, Peak: 2 << 30, Evictions: 10},
			{Trace: "unet", Heuristic: "dtr", Ratio: 0.5, Budget: replay.Budget(0.5, 8<<30), Status: "ok", Overhead: 1.159, Peak: 4 << 30, Evictions: 34, Rematerializations: 57,
				VictimSearches: 4, VictimSearchTime: 8 * time.Microsecond, VictimSearchMean: 2 * time.Microsecond, Wall: 3 * time.Millisecond},
			{Trace: "unet", Heuristic: "msps", Ratio: 0.3, Budget: replay.Budget(0.3, 8<<30), Status: "over-limit", Reason: "overhead above the limit", Overhead: 2.01, Peak: 2 << 30},
			{Trace: "unet", Heuristic: "msps", Ratio: 0.5, Budget: replay.Budget(0.5, 8<<30), Status: "ok", Overhead: 1.132, Peak: 4<<30 + 1, BudgetViolated: true},
		}}
	finishTrace(tr)
	return &Report{Ratios: []float64{0.3, 0.5}, Heuristics: []string{"dtr", "msps"}, Memory: "counting", OverheadLimit: 2, Workers: 2, Traces: []*TraceReport{tr}}
}

func TestWriteTable(t *testing.T) {
	rep := sampleReport()
	var b bytes.Buffer
	require.NoError(t, WriteTable(&b, rep.Traces[0], 2))
	out := b.String()
	t.Log("\n" + out)
	lines := strings.Split(out, "\n")
	assert.Equal(t, "== unet (/s/unet.log)", lines[0])
	assert.Equal(t, "baseline: peak 8.00 GiB (8589934592 B), compute 435ms, 1829 instructions (parse 0ns, replay 0ns)", lines[1])
	assert.Equal(t, "heuristic  ratio    budget  status       overhead  evictions  remats      peak  search/mean    wall", lines[2])
	assert.Equal(t, "dtr         0.30  2.40 GiB  oom               OOM         10       0  2.00 GiB            -     0ns", lines[3])
	assert.Equal(t, "dtr         0.50  4.00 GiB  ok              1.159         34      57  4.00 GiB       2.00µs  3.00ms", lines[4])
	assert.Equal(t, "msps        0.30  2.40 GiB  over-limit        >2x          0       0  2.00 GiB            -     0ns", lines[5])
	assert.Equal(t, "msps        0.50  4.00 GiB  ok VIOLATED     1.132          0       0  4.00 GiB            -     0ns", lines[6])
	assert.Contains(t, out, "Pareto frontier (budget vs overhead, across heuristics):\n")
	assert.Contains(t, out, "  ratio    budget  overhead  heuristic\n   0.50  4.00 GiB     1.159  dtr\n",
		"msps at 0.5 broke its budget: not on the frontier")
	assert.Contains(t, out, "!!! BUDGET VIOLATED in 1 run(s) of unet")
	assert.Contains(t, out, "!!!   unet msps ratio 0.50: peak 4294967297 B > budget 4294967296 B (by 1 B)")

	// no feasible run, no violation
	tr := &TraceReport{Name: "x", Runs: []RunResult{{Heuristic: "dtr", Ratio: 0.1, Status: "oom"}}}
	finishTrace(tr)
	b.Reset()
	require.NoError(t, WriteTable(&b, tr, 2))
	assert.Contains(t, b.String(), "Pareto frontier (budget vs overhead, across heuristics): none (no run finished)")
	assert.Contains(t, b.String(), "budget violations: none")

	assert.Error(t, WriteTable(failWriter{}, rep.Traces[0], 2))
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, io.ErrShortWrite }

func TestWriteCSV(t *testing.T) {
	rep := sampleReport()
	var b bytes.Buffer
	require.NoError(t, WriteCSV(&b, rep))
	recs, err := csv.NewReader(&b).ReadAll()
	require.NoError(t, err)
	require.Len(t, recs, 5)
	assert.Equal(t, csvHeader, recs[0])
	row := map[string]string{}
	for i, h := range recs[0] {
		row[h] = recs[2][i]
	}
	assert.Equal(t, "unet", row["trace"])
	assert.Equal(t, "dtr", row["heuristic"])
	assert.Equal(t, "0.5", row["ratio"])
	assert.Equal(t, "4294967296", row["budget_bytes"])
	assert.Equal(t, "ok", row["status"])
	assert.Equal(t, "1.159", row["overhead"])
	assert.Equal(t, "57", row["rematerializations"])
	assert.Equal(t, "2000", row["victim_search_mean_ns"])
	assert.Equal(t, "3000000", row["wall_ns"])
	assert.Equal(t, "true", row["pareto"])
	assert.Equal(t, "8589934592", row["baseline_peak_bytes"])
	assert.Equal(t, "nothing evictable", recs[1][9])
	assert.Equal(t, "true", recs[4][len(csvHeader)-7], "budget_violated")
	assert.Equal(t, "close_error", csvHeader[len(csvHeader)-5])
	assert.Equal(t, "first_step_overhead", csvHeader[len(csvHeader)-1])
	assert.Error(t, WriteCSV(failWriter{}, rep))
}

func TestWriteJSON(t *testing.T) {
	rep := sampleReport()
	var b bytes.Buffer
	require.NoError(t, WriteJSON(&b, rep))
	var back Report
	require.NoError(t, json.Unmarshal(b.Bytes(), &back))
	assert.Equal(t, rep, &back)
	var raw map[string]any
	require.NoError(t, json.Unmarshal(b.Bytes(), &raw))
	run := raw["traces"].([]any)[0].(map[string]any)["runs"].([]any)[1].(map[string]any)
	assert.Equal(t, 2000.0, run["victim_search_mean_ns"])
	assert.Equal(t, "ok", run["status"])
}

func TestWriteMarkdown(t *testing.T) {
	rep := sampleReport()
	var b bytes.Buffer
	require.NoError(t, WriteMarkdown(&b, rep, DTRReference()))
	out := b.String()
	t.Log("\n" + out)
	assert.True(t, strings.HasPrefix(out, "Memory model: counting; engine: memscale default; overhead limit: 2x.\n\n### unet\n"))
	assert.Contains(t, out, "| ratio | dtr | dtr (ref) | msps | msps (ref) |\n|---|---|---|---|---|\n")
	assert.Contains(t, out, "| 0.30 | OOM | OOM | >2x | 1.585 |\n")
	assert.Contains(t, out, "| 0.50 | **1.159** | 1.159 | 1.132 | 1.132 |\n")

	b.Reset()
	rep.SimulatorCompat, rep.OverheadLimit = true, -1
	require.NoError(t, WriteMarkdown(&b, rep, nil))
	assert.Contains(t, b.String(), "| ratio | dtr | msps |\n")
	assert.Contains(t, b.String(), "engine: simulator-compatible; overhead limit: none.")
	assert.Error(t, WriteMarkdown(failWriter{}, rep, nil))
}

func TestDTRReference(t *testing.T) {
	ref := DTRReference()
	assert.Len(t, ref, 5)
	for trace, want := range map[string]int{"resnet32": 4, "tv_densenet121": 4, "transformer": 4, "lstm": 4, "unet": 5} {
		for _, h := range []string{"dtr", "dtr-eq", "msps", "lru", "size"} {
			assert.Len(t, ref[trace][h], want, "%s %s", trace, h)
		}
	}
	c, ok := ref.Get("transformer", "dtr-eq", 0.2)
	assert.True(t, ok)
	assert.Equal(t, "1.545", c)
	c, ok = ref.Get("lstm", "lru", 0.2)
	assert.True(t, ok)
	assert.Equal(t, "OOM", c)
	_, ok = ref.Get("unet", "dtr", 0.2)
	assert.False(t, ok)
	_, ok = ref.Get("nope", "dtr", 0.2)
	assert.False(t, ok)
}

func TestFormatting(t *testing.T) {
	for in, want := range map[float64]string{0.3: "0.30", 0.25: "0.25", 1: "1.00", 0.125: "0.125"} {
		assert.Equal(t, want, FormatRatio(in), "%v", in)
	}
	for in, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1.00 KiB", 3 << 29: "1.50 GiB", 8415764640: "7.84 GiB"} {
		assert.Equal(t, want, FormatBytes(in), "%d", in)
	}
	for in, want := range map[time.Duration]string{
		870: "870ns", 1234: "1.23µs", 12345: "12.3µs", 123456: "123µs", 4_560_000: "4.56ms",
		1_234_000_000: "1.23s", 42 * time.Second: "42.0s", 185 * time.Second: "185s",
	} {
		assert.Equal(t, want, FormatDuration(in), "%d", int64(in))
	}
	r := RunResult{Status: "ok", Overhead: 1.23456}
	assert.Equal(t, "1.235", OverheadCell(&r, 2))
	r.Status = "over-limit"
	assert.Equal(t, ">2.5x", OverheadCell(&r, 2.5))
	r.Status = "oom"
	assert.Equal(t, "OOM", OverheadCell(&r, 2))
	r.Status = StatusError
	assert.Equal(t, "error", OverheadCell(&r, 2))
}
