package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/sharedtraces"
	"github.com/memscale/memscale/internal/sweep"
)

const tinyTrace = "testdata/tiny.log"

func TestParseReplayArgs(t *testing.T) {
	def := replayOptions{
		traces:        []string{"t.log"},
		ratios:        sweep.DefaultRatios(),
		heuristics:    []evict.Heuristic{evict.Auto},
		memory:        "count",
		overheadLimit: 2,
		jobs:          runtime.GOMAXPROCS(0),
	}
	with := func(f func(o *replayOptions)) replayOptions {
		o := def
		f(&o)
		return o
	}
	tests := []struct {
		name    string
		args    []string
		want    replayOptions
		wantErr string // "" = no error; a usageError is expected otherwise
	}{
		{name: "defaults", args: []string{"t.log"}, want: def},
		{name: "flags after traces", args: []string{"a.log", "--ratios", "0.5,0.2", "b.log", "--heuristic=dtr,msps", "-quiet"},
			want: with(func(o *replayOptions) {
				o.traces = []string{"a.log", "b.log"}
				o.ratios = []float64{0.2, 0.5}
				o.heuristics = []evict.Heuristic{evict.DTR, evict.MSPS}
				o.quiet = true
			})},
		{name: "double dash", args: []string{"--jobs", "3", "--", "--weird.log", "t.log"},
			want: with(func(o *replayOptions) { o.traces = []string{"--weird.log", "t.log"}; o.jobs = 3 })},
		{name: "all outputs", args: []string{"t.log", "--csv", "o.csv", "--json", "o.json", "--plot", "o.png", "--markdown", "o.md", "--check", "--simulator-compat"},
			want: with(func(o *replayOptions) {
				o.csv, o.json, o.plot, o.markdown = "o.csv", "o.json", "o.png", "o.md"
				o.check, o.simulatorCompat = true, true
			})},
		{name: "ratio range", args: []string{"t.log", "--ratios", "0.2..0.9"},
			want: with(func(o *replayOptions) { o.ratios = []float64{0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9} })},
		{name: "all heuristics", args: []string{"t.log", "--heuristic", "all"},
			want: with(func(o *replayOptions) { o.heuristics = append(evict.Heuristics(), evict.Auto) })},
		{name: "memory allocator parses", args: []string{"t.log", "--memory", "allocator"},
			want: with(func(o *replayOptions) { o.memory = "allocator" })},
		{name: "memory counting alias", args: []string{"t.log", "--memory", "Counting"},
			want: with(func(o *replayOptions) { o.memory = "counting" })},
		{name: "overhead limit", args: []string{"t.log", "--overhead-limit", "3.5"},
			want: with(func(o *replayOptions) { o.overheadLimit = 3.5 })},
		{name: "no overhead limit", args: []string{"t.log", "--overhead-limit", "none"},
			want: with(func(o *replayOptions) { o.overheadLimit = -1 })},
		{name: "overhead limit 0", args: []string{"t.log", "--overhead-limit", "0"},
			want: with(func(o *replayOptions) { o.overheadLimit = -1 })},
		{name: "overhead limit inf", args: []string{"t.log", "--overhead-limit", "inf"},
			want: with(func(o *replayOptions) { o.overheadLimit = -1 })},

		{name: "budgets next to ratios", args: []string{"t.log", "--budgets", "24GiB, 40GiB,500MB", "--ratios", "0.5"},
			want: with(func(o *replayOptions) {
				o.ratios = []float64{0.5}
				o.budgets = []sweep.Budget{{Label: "24GiB", Bytes: 24 << 30}, {Label: "40GiB", Bytes: 40 << 30}, {Label: "500MB", Bytes: 500e6}}
			})},
		{name: "budgets empty", args: []string{"t.log", "--budgets", ""}, want: def},

		{name: "budget not a size", args: []string{"t.log", "--budgets", "24GiB,lots"}, wantErr: `--budgets: "lots"`},
		{name: "budget zero", args: []string{"t.log", "--budgets", "0"}, wantErr: `--budgets: "0": a budget of 0 bytes`},
		{name: "no trace", args: []string{"--ratios", "0.5"}, wantErr: "no trace given"},
		{name: "ratio zero", args: []string{"t.log", "--ratios", "0"}, wantErr: `--ratios: ratio "0" out of range`},
		{name: "ratio negative", args: []string{"t.log", "--ratios", "0.5,-0.2"}, wantErr: `--ratios: ratio "-0.2" out of range`},
		{name: "ratio above one", args: []string{"t.log", "--ratios", "1.01"}, wantErr: `--ratios: ratio "1.01" out of range`},
		{name: "ratio not a number", args: []string{"t.log", "--ratios", "half"}, wantErr: `--ratios: ratio "half" is not a number`},
		{name: "ratio empty", args: []string{"t.log", "--ratios", ""}, wantErr: "--ratios: empty ratio list"},
		{name: "unknown heuristic", args: []string{"t.log", "--heuristic", "dtr,belady"}, wantErr: `--heuristic: unknown heuristic "belady"`},
		{name: "unknown memory", args: []string{"t.log", "--memory", "disk"}, wantErr: `--memory: unknown memory model "disk" (accepted: count, allocator)`},
		{name: "limit not a number", args: []string{"t.log", "--overhead-limit", "lots"}, wantErr: `--overhead-limit: "lots" is not a number`},
		{name: "limit below one", args: []string{"t.log", "--overhead-limit", "0.5"}, wantErr: `--overhead-limit: "0.5": must be above 1`},
		{name: "limit one", args: []string{"t.log", "--overhead-limit", "1"}, wantErr: "must be above 1"},
		{name: "limit NaN", args: []string{"t.log", "--overhead-limit", "NaN"}, wantErr: "must be above 1"},
		{name: "jobs zero", args: []string{"t.log", "--jobs", "0"}, wantErr: "--jobs: 0: must be at least 1"},
		{name: "jobs not a number", args: []string{"t.log", "--jobs", "many"}, wantErr: `invalid value "many" for flag -jobs`},
		{name: "unknown flag", args: []string{"t.log", "--budget", "3"}, wantErr: "flag provided but not defined: -budget"},
		{name: "flag without value", args: []string{"t.log", "--ratios"}, wantErr: "flag needs an argument: -ratios"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseReplayArgs(tc.args, io.Discard)
			if tc.wantErr != "" {
				require.Error(t, err)
				var ue usageError
				assert.True(t, errors.As(err, &ue), "a usage error: %v", err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}

	var out bytes.Buffer
	_, err := parseReplayArgs([]string{"-h"}, &out)
	assert.ErrorIs(t, err, flag.ErrHelp)
	assert.Contains(t, out.String(), "usage: memscale replay TRACE...")
	assert.Contains(t, out.String(), "-overhead-limit")
}

// TestReplayExitCodes runs the command through the dispatcher.
func TestReplayExitCodes(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.log")
	require.NoError(t, os.WriteFile(bad, []byte(`{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}`+"\n"+`{"INSTRUCTION":"CALL","NAME":"f"`+"\n"), 0o644))
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  []string
	}{
		{name: "help", args: []string{"replay", "-h"}, wantCode: 0},
		{name: "no trace", args: []string{"replay"}, wantCode: 2, wantErr: []string{"memscale: error: replay: no trace given", "see 'memscale replay -h'"}},
		{name: "bad ratio", args: []string{"replay", tinyTrace, "--ratios", "2"}, wantCode: 2, wantErr: []string{`ratio "2" out of range`}},
		{name: "unknown heuristic", args: []string{"replay", tinyTrace, "--heuristic", "nope"}, wantCode: 2, wantErr: []string{`unknown heuristic "nope"`}},
		{name: "malformed trace", args: []string{"replay", bad, "--ratios", "0.5"}, wantCode: 1, wantErr: []string{"memscale: error: replay: trace " + bad, "line 2", "bad JSON"}},
		{name: "unknown trace", args: []string{"replay", filepath.Join(dir, "absent.log")}, wantCode: 1, wantErr: []string{"absent.log", "no such file"}},
		// budgets of a few KiB are below one 2 MiB segment: every run is OOM
		{name: "allocator model", args: []string{"replay", tinyTrace, "--memory", "allocator", "--ratios", "1"}, wantCode: 0},
		{name: "unwritable csv", args: []string{"replay", tinyTrace, "--csv", filepath.Join(dir, "no", "such", "dir.csv")}, wantCode: 1, wantErr: []string{"--csv:", "dir.csv"}},
		{name: "ok", args: []string{"replay", tinyTrace, "--ratios", "0.6", "--quiet"}, wantCode: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCmd(tc.args...)
			assert.Equal(t, tc.wantCode, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
			for _, w := range tc.wantErr {
				assert.Contains(t, errOut, w)
			}
		})
	}

	// A failed sweep leaves no half-written output behind.
	csvPath := filepath.Join(dir, "out.csv")
	code, _, _ := runCmd("replay", bad, "--csv", csvPath)
	assert.Equal(t, 1, code)
	assert.NoFileExists(t, csvPath)
}

// TestReplayEndToEnd runs the hand-written trace through the command with
// every output.
func TestReplayEndToEnd(t *testing.T) {
	dir := t.TempDir()
	csvPath := filepath.Join(dir, "out.csv")
	jsonPath := filepath.Join(dir, "out.json")
	pngPath := filepath.Join(dir, "out.png")
	mdPath := filepath.Join(dir, "out.md")
	// the same trace, gzip-compressed
	raw, err := os.ReadFile(tinyTrace)
	require.NoError(t, err)
	gzPath := filepath.Join(dir, "tinygz.log.gz")
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, err = zw.Write(raw)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	require.NoError(t, os.WriteFile(gzPath, zb.Bytes(), 0o644))

	var stdout, stderr bytes.Buffer
	err = replayCommand(context.Background(), []string{
		tinyTrace, gzPath, "--ratios", "0.1,0.6,0.9,1", "--heuristic", "dtr,msps,lru", "--check",
		"--csv", csvPath, "--json", jsonPath, "--plot", pngPath, "--markdown", mdPath,
	}, &stdout, &stderr, replayEnv{isTTY: func(io.Writer) bool { return false }})
	require.NoError(t, err, "stderr: %s", stderr.String())
	out := stdout.String()
	t.Log("\n" + out)
	assert.Empty(t, stderr.String(), "no progress line when stderr is not a terminal")

	// tables
	assert.Contains(t, out, "== tiny (testdata/tiny.log)\nbaseline: peak 2.46 KiB (2520 B), compute 8.76µs, 28 instructions")
	assert.Contains(t, out, "== tinygz ("+gzPath+")\n")
	assert.Contains(t, out, "heuristic  ratio    budget  status  overhead  evictions  remats      peak  search/mean")
	assert.Regexp(t, `(?m)^dtr\s+0\.10\s+252 B\s+oom\s+OOM\s`, out)
	assert.Regexp(t, `(?m)^dtr\s+1\.00\s+2\.46 KiB\s+ok\s+1\.000\s+0\s+0\s`, out)
	assert.Contains(t, out, "Pareto frontier (budget vs overhead, across heuristics):\n")
	assert.Equal(t, 2, strings.Count(out, "budget violations: none"))
	assert.Contains(t, out, "24 runs (2 traces x 3 heuristics x 4 ratios) in ")

	// CSV: one row per run
	f, err := os.Open(csvPath)
	require.NoError(t, err)
	recs, err := csv.NewReader(f).ReadAll()
	f.Close()
	require.NoError(t, err)
	require.Len(t, recs, 1+24)
	assert.Equal(t, "trace", recs[0][0])
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	for _, r := range recs[1:] {
		assert.Contains(t, []string{"ok", "oom", "over-limit"}, r[col["status"]])
		assert.Equal(t, "false", r[col["budget_violated"]])
		assert.Equal(t, "2520", r[col["baseline_peak_bytes"]])
	}

	// JSON: the two traces, parsed once each, the same results (gzip is
	// transparent)
	b, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	var rep sweep.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Len(t, rep.Traces, 2)
	assert.Equal(t, []string{"dtr", "msps", "lru"}, rep.Heuristics)
	assert.Equal(t, []float64{0.1, 0.6, 0.9, 1}, rep.Ratios)
	a, g := rep.Traces[0], rep.Traces[1]
	assert.Equal(t, a.Baseline.Peak, g.Baseline.Peak)
	require.Len(t, a.Runs, 12)
	for i := range a.Runs {
		assert.Equal(t, a.Runs[i].Status, g.Runs[i].Status)
		assert.Equal(t, a.Runs[i].Overhead, g.Runs[i].Overhead)
	}
	assert.NotEmpty(t, a.Frontier)

	// PNG decodes
	pf, err := os.Open(pngPath)
	require.NoError(t, err)
	img, err := png.Decode(pf)
	pf.Close()
	require.NoError(t, err)
	assert.Greater(t, img.Bounds().Dx(), 500)

	// Markdown
	md, err := os.ReadFile(mdPath)
	require.NoError(t, err)
	assert.Contains(t, string(md), "### tiny\n")
	assert.Contains(t, string(md), "| ratio | dtr | msps | lru |\n")
}

// TestReplayBudgets replays at absolute budgets next to the ratios: runs at
// each budget after each heuristic's ratios, violates_<budget> on every run
// in the table, the CSV and the JSON (the same parsing as memscale plan).
func TestReplayBudgets(t *testing.T) {
	dir := t.TempDir()
	csvPath, jsonPath := filepath.Join(dir, "out.csv"), filepath.Join(dir, "out.json")
	var stdout, stderr bytes.Buffer
	// tiny.log's peak is 2520 B: 1KiB and 2000B need evictions, 4KiB fits it.
	err := replayCommand(context.Background(), []string{
		tinyTrace, "--ratios", "0.5,1", "--budgets", "1KiB,2000B,4KiB", "--heuristic", "dtr,lru",
		"--csv", csvPath, "--json", jsonPath, "--plot", filepath.Join(dir, "out.png"),
	}, &stdout, &stderr, replayEnv{isTTY: func(io.Writer) bool { return false }})
	require.NoError(t, err, "stderr: %s", stderr.String())
	out := stdout.String()
	t.Log("\n" + out)
	assert.Contains(t, out, "violates_1KiB  violates_2000B  violates_4KiB\n")
	assert.Regexp(t, `(?m)^dtr\s+1\.625\s+4\.00 KiB \(4KiB\)\s+ok\s+1\.000\s+0\s+0\s+2\.46 KiB\s+.*\s+true\s+true\s+false$`, out)
	assert.Regexp(t, `(?m)^lru\s+1\.00\s+2\.46 KiB\s+ok\s+1\.000\s.*\s+true\s+true\s+false$`, out)
	assert.Contains(t, out, "10 runs (1 traces x 2 heuristics x (2 ratios + 3 budgets)) in ")

	b, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	var rep sweep.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	assert.Equal(t, []sweep.Budget{{Label: "1KiB", Bytes: 1024}, {Label: "2000B", Bytes: 2000}, {Label: "4KiB", Bytes: 4096}}, rep.Budgets)
	runs := rep.Traces[0].Runs
	require.Len(t, runs, 10)
	for h, name := range []string{"dtr", "lru"} {
		for k, want := range []struct {
			label  string
			budget uint64
		}{{"", 1260}, {"", 2520}, {"1KiB", 1024}, {"2000B", 2000}, {"4KiB", 4096}} {
			r := runs[5*h+k]
			assert.Equal(t, name, r.Heuristic)
			assert.Equal(t, want.label, r.BudgetLabel)
			assert.Equal(t, want.budget, r.Budget)
			assert.InDelta(t, float64(want.budget)/2520, r.Ratio, 1e-9)
			require.Len(t, r.Violates, 3)
			for _, bud := range rep.Budgets {
				assert.Equal(t, !r.Feasible() || r.Peak > bud.Bytes, r.Violates["violates_"+bud.Label], "%s %s", r.Heuristic, bud.Label)
			}
			if r.Feasible() {
				assert.LessOrEqual(t, r.Peak, r.Budget)
			}
		}
		assert.False(t, runs[5*h+4].Violates["violates_4KiB"], "a run at a budget above the peak fits it")
		assert.Equal(t, int64(0), runs[5*h+4].Evictions)
	}

	f, err := os.Open(csvPath)
	require.NoError(t, err)
	recs, err := csv.NewReader(f).ReadAll()
	f.Close()
	require.NoError(t, err)
	require.Len(t, recs, 1+10)
	hdr := recs[0]
	assert.Equal(t, []string{"budget_label", "violates_1KiB", "violates_2000B", "violates_4KiB"}, hdr[len(hdr)-4:])
	assert.Equal(t, []string{"4KiB", "true", "true", "false"}, recs[5][len(hdr)-4:], "dtr at 4KiB")
	assert.Equal(t, []string{"2000B", "true", "false", "false"}, recs[4][len(hdr)-4:], "dtr at 2000B")

	// Without --budgets the CSV keeps its columns.
	require.NoError(t, replayCommand(context.Background(), []string{tinyTrace, "--ratios", "0.5", "--heuristic", "dtr", "--csv", csvPath, "--quiet"},
		io.Discard, io.Discard, replayEnv{}))
	f, err = os.Open(csvPath)
	require.NoError(t, err)
	recs, err = csv.NewReader(f).ReadAll()
	f.Close()
	require.NoError(t, err)
	assert.NotContains(t, recs[0], "budget_label")
}

func TestReplayProgressAndQuiet(t *testing.T) {
	tty := replayEnv{isTTY: func(io.Writer) bool { return true }}
	var stdout, stderr bytes.Buffer
	require.NoError(t, replayCommand(context.Background(), []string{tinyTrace, "--ratios", "0.5,0.9", "--heuristic", "dtr,lru", "--jobs", "1"}, &stdout, &stderr, tty))
	p := stderr.String()
	assert.Contains(t, p, "\r[0/4] tiny dtr 0.50 ...")
	assert.Contains(t, p, "\r[4/4] tiny lru 0.90 ok ")
	assert.True(t, strings.HasSuffix(p, "\r"), "the line is cleared at the end: %q", p)
	assert.NotContains(t, p, "\n")
	assert.Contains(t, stdout.String(), "== tiny")
	assert.NotContains(t, stdout.String(), "\r")

	stdout.Reset()
	stderr.Reset()
	require.NoError(t, replayCommand(context.Background(), []string{tinyTrace, "--ratios", "0.5", "--quiet"}, &stdout, &stderr, tty))
	assert.Empty(t, stdout.String())
	assert.Empty(t, stderr.String())
}

func TestProgressLine(t *testing.T) {
	var b bytes.Buffer
	p := &progressLine{w: &b}
	p.clear()
	assert.Empty(t, b.String())
	p.show("[1/2] long line")
	p.show("[2/2] short")
	p.clear()
	assert.Equal(t, "\r[1/2] long line\r[2/2] short    \r"+strings.Repeat(" ", 11)+"\r", b.String())
	b.Reset()
	p.show(strings.Repeat("x", 200))
	assert.Len(t, b.String(), 1+maxProgressWidth)
	assert.False(t, isTerminal(&b))
}

// TestReplaySharedTrace replays a shared trace by name; it skips when the
// shared traces are absent.
func TestReplaySharedTrace(t *testing.T) {
	sharedtraces.ForTest(t)
	code, out, errOut := runCmd("replay", "unet", "--ratios", "0.5,0.8", "--heuristic", "dtr,msps")
	require.Equal(t, 0, code, "stderr: %s", errOut)
	assert.Contains(t, out, "== unet (")
	assert.Contains(t, out, "baseline: peak 7.84 GiB (8415764640 B), compute 435ms")
	assert.Regexp(t, `(?m)^msps\s+0\.80\s+6\.27 GiB\s+ok\s+1\.0\d\d\s`, out)
	assert.Contains(t, out, "budget violations: none")
}

// TestReplayAllocatorModel replays a shared trace with every storage placed
// in a caching allocator on a simulated card; it skips when the shared
// traces are absent.
func TestReplayAllocatorModel(t *testing.T) {
	sharedtraces.ForTest(t)
	jsonPath := filepath.Join(t.TempDir(), "alloc.json")
	var stdout, stderr bytes.Buffer
	err := replayCommand(context.Background(), []string{"unet", "--memory", "allocator", "--ratios", "0.5,0.9", "--heuristic", "msps", "--check", "--json", jsonPath, "--quiet"},
		&stdout, &stderr, replayEnv{shared: sharedtraces.List})
	require.NoError(t, err, "stderr: %s", stderr.String())
	b, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	var rep sweep.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	assert.Equal(t, "allocator", rep.Memory)
	require.Len(t, rep.Traces, 1)
	for _, r := range rep.Traces[0].Runs {
		assert.Equal(t, "allocator", r.Memory)
		assert.Equal(t, "ok", r.Status, "%+v", r)
		assert.LessOrEqual(t, r.Peak, r.Budget)
		assert.Greater(t, r.Overhead, 1.0)
	}
}
