package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/plot"
	"github.com/memscale/memscale/internal/sharedtraces"
	"github.com/memscale/memscale/internal/sweep"
	"github.com/memscale/memscale/replay"
)

func init() {
	register(command{
		name:    "replay",
		summary: "replay DTR traces under memory budgets: overhead per heuristic and budget ratio",
		run: func(args []string, stdout, stderr io.Writer) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
			defer stop()
			return replayCommand(ctx, args, stdout, stderr, replayEnv{
				shared: sharedtraces.List,
				isTTY:  isTerminal,
			})
		},
	})
}

const replaySynopsis = `replay TRACE... [--ratios 0.1,0.2,...,0.9] [--budgets 24GiB,40GiB,80GiB]
       [--heuristic dtr,dtr-eq,msps,...|all] [--memory count|allocator] [--csv FILE] [--json FILE] [--plot FILE.png] [--markdown FILE]
       [--overhead-limit 2] [--jobs N] [--simulator-compat] [--check] [--quiet]

TRACE is a DTR trace file (.log, or gzip-compressed .log.gz), the name of a
shared trace (resnet32, tv_densenet121, transformer, lstm, unet, or a unique
part of one) or all-shared. Each trace is replayed once without a budget (the
baseline: peak bytes and compute), then under budget = ratio x baseline peak
for every heuristic and ratio, and under each --budgets size (absolute budgets,
next to the ratios; every run is flagged violates_<budget> when it did not
finish or its peak is above that budget), on a pool of --jobs workers.`

// replayEnv is what the command takes from the process (tests fake it).
type replayEnv struct {
	// shared lists the shared traces.
	shared sweep.SharedLister
	// isTTY reports whether a writer is a terminal (progress line).
	isTTY func(w io.Writer) bool
}

// replayOptions are the parsed command line.
type replayOptions struct {
	traces          []string
	ratios          []float64
	budgets         []sweep.Budget
	heuristics      []evict.Heuristic
	memory          string // "count" or "allocator"
	csv, json       string
	plot, markdown  string
	overheadLimit   float64 // replay.Options convention: <0 = none
	jobs            int
	simulatorCompat bool
	check           bool
	quiet           bool
}

// memoryModel returns the factory for a --memory value (nil = the
// byte-counting model).
func memoryModel(name string) (sweep.MemoryFactory, error) {
	switch name {
	case "count", "counting":
		return nil, nil
	case "allocator":
		// Each budgeted run gets a simulated card and a caching allocator
		// whose hard limit is the budget.
		return func(budget uint64) (replay.MemoryModel, error) {
			return replay.NewSimAllocatorModel(budget)
		}, nil
	}
	return nil, fmt.Errorf("unknown memory model %q (accepted: count, allocator)", name)
}

// parseReplayArgs parses the command line. Flags and traces may be mixed;
// everything after "--" is a trace.
func parseReplayArgs(args []string, stdout io.Writer) (replayOptions, error) {
	fs := newFlagSet("replay", replaySynopsis, stdout)
	ratios := fs.String("ratios", "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", "budget ratios (fractions of the baseline peak, in (0,1]): a comma list; lo..hi or lo..hi/step ranges are accepted")
	budgets := fs.String("budgets", "", "absolute budgets, a comma list of sizes (24GiB,40GiB,80GiB): each trace is replayed at each next to the ratios, and every run flagged violates_<budget>")
	heur := fs.String("heuristic", "auto", "comma list of heuristics ("+heuristicNames()+"), or all")
	memory := fs.String("memory", "count", "memory model: count (bytes, as the DTR simulator) or allocator")
	csvPath := fs.String("csv", "", "write every run to this CSV file")
	jsonPath := fs.String("json", "", "write the report to this JSON file")
	plotPath := fs.String("plot", "", "write a PNG of overhead against budget ratio (one panel per trace) to this file")
	mdPath := fs.String("markdown", "", "write Markdown overhead tables (with the DTR paper's reference numbers for the shared traces) to this file")
	limit := fs.String("overhead-limit", "2", "abandon a run when its overhead exceeds this (> 1; 0, none or inf = no limit)")
	jobs := fs.Int("jobs", runtime.GOMAXPROCS(0), "runs in parallel")
	compat := fs.Bool("simulator-compat", false, "engine reproduces the DTR authors' simulator exactly (evict.Config.SimulatorCompat)")
	check := fs.Bool("check", false, "verify replay invariants after every instruction (slow)")
	quiet := fs.Bool("quiet", false, "no tables and no progress line on the terminal (budget violations are still reported)")

	var opt replayOptions
	rest := args
	var tail []string
	for i, a := range args {
		if a == "--" {
			rest, tail = args[:i], args[i+1:]
			break
		}
	}
	traces, err := parseInterleaved(fs, rest)
	if err != nil {
		return opt, err
	}
	opt.traces = append(traces, tail...)
	if len(opt.traces) == 0 {
		return opt, usagef("no trace given (a trace file, a shared trace name or %s)", sweep.AllShared)
	}

	if opt.ratios, err = sweep.ParseRatios(*ratios); err != nil {
		return opt, usagef("--ratios: %v", err)
	}
	if opt.budgets, err = parseBudgets("--budgets", *budgets); err != nil {
		return opt, usageError{err.Error()}
	}
	if opt.heuristics, err = sweep.ParseHeuristics(*heur); err != nil {
		return opt, usagef("--heuristic: %v", err)
	}
	opt.memory = strings.ToLower(strings.TrimSpace(*memory))
	if _, err := memoryModel(opt.memory); err != nil {
		return opt, usagef("--memory: %v", err)
	}
	if opt.overheadLimit, err = parseOverheadLimit(*limit); err != nil {
		return opt, usagef("--overhead-limit: %v", err)
	}
	if *jobs < 1 {
		return opt, usagef("--jobs: %d: must be at least 1", *jobs)
	}
	opt.jobs = *jobs
	opt.csv, opt.json, opt.plot, opt.markdown = *csvPath, *jsonPath, *plotPath, *mdPath
	opt.simulatorCompat, opt.check, opt.quiet = *compat, *check, *quiet
	return opt, nil
}

// parseOverheadLimit parses --overhead-limit: a number > 1, or 0/none/inf
// for no limit (returned as -1, replay's "never").
func parseOverheadLimit(s string) (float64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "none" || t == "off" {
		return -1, nil
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	switch {
	case math.IsInf(v, 1), v == 0:
		return -1, nil
	case math.IsNaN(v) || v <= 1:
		return 0, fmt.Errorf("%q: must be above 1 (overhead is total compute / baseline compute), or 0 for no limit", s)
	}
	return v, nil
}

// heuristicNames lists the heuristic names for the help text.
func heuristicNames() string {
	return strings.Join(heuristicOrder(), ", ") + "; default = " + evict.Default.Resolve().String() +
		"; auto = the default heuristic for a first step, then the configuration tuned on it"
}

// replayCommand runs `memscale replay`.
func replayCommand(ctx context.Context, args []string, stdout, stderr io.Writer, env replayEnv) error {
	opt, err := parseReplayArgs(args, stdout)
	if err != nil {
		return err
	}
	memory, err := memoryModel(opt.memory)
	if err != nil {
		return err
	}
	inputs, err := sweep.Resolve(opt.traces, env.shared)
	if err != nil {
		return err
	}
	// Open the outputs now: a bad path fails before a long sweep. Files
	// not completed are removed.
	outs, err := openOutputs(map[string]string{"csv": opt.csv, "json": opt.json, "markdown": opt.markdown, "plot": opt.plot})
	if err != nil {
		return err
	}
	defer outs.abort()

	progress := &progressLine{w: stderr}
	showProgress := !opt.quiet && env.isTTY != nil && env.isTTY(stderr)
	var writeErr error
	cfg := sweep.Config{
		Ratios:        opt.ratios,
		Budgets:       opt.budgets,
		Heuristics:    opt.heuristics,
		Engine:        evict.Config{SimulatorCompat: opt.simulatorCompat},
		OverheadLimit: opt.overheadLimit,
		Memory:        memory,
		MemoryName:    memoryName(opt.memory),
		Check:         opt.check,
		Workers:       opt.jobs,
		TraceDone: func(t *sweep.TraceReport) {
			progress.clear()
			if !opt.quiet && writeErr == nil {
				writeErr = sweep.WriteTable(stdout, t, limitOrDefault(opt.overheadLimit))
			}
			for _, i := range t.Violations {
				fmt.Fprintf(stderr, "memscale replay: BUDGET VIOLATED: %s\n", sweep.ViolationLine(&t.Runs[i]))
			}
		},
	}
	if showProgress {
		cfg.Progress = func(p sweep.Progress) {
			s := fmt.Sprintf("[%d/%d] %s %s %s", p.Done, p.Total, p.Trace, p.Heuristic, sweep.FormatRatio(p.Ratio))
			if p.Result == nil {
				s += " ..."
			} else {
				s += fmt.Sprintf(" %s %s (%s)", p.Result.Status, sweep.OverheadCell(p.Result, limitOrDefault(opt.overheadLimit)), sweep.FormatDuration(p.Result.Wall))
			}
			progress.show(s)
		}
	}
	rep, err := sweep.Run(ctx, inputs, cfg)
	progress.clear()
	if err != nil {
		return err
	}
	if writeErr != nil {
		return fmt.Errorf("writing the tables: %w", writeErr)
	}
	if !opt.quiet {
		per := fmt.Sprintf("%d ratios", len(opt.ratios))
		if len(opt.budgets) > 0 {
			per = fmt.Sprintf("(%d ratios + %d budgets)", len(opt.ratios), len(opt.budgets))
		}
		if _, err := fmt.Fprintf(stdout, "%d runs (%d traces x %d heuristics x %s) in %s on %d workers\n",
			len(inputs)*len(opt.heuristics)*(len(opt.ratios)+len(opt.budgets)), len(inputs), len(opt.heuristics), per,
			sweep.FormatDuration(rep.Wall), rep.Workers); err != nil {
			return fmt.Errorf("writing the summary: %w", err)
		}
	}
	if err := writeReplayOutputs(rep, outs); err != nil {
		return err
	}
	if n, first := rep.CloseErrors(); n > 0 {
		fmt.Fprintf(stderr, "memscale replay: warning: the memory model of %d run(s) reported an error when closed (results stand; close_error in --csv/--json); first: %s\n", n, first)
	}
	var problems []string
	if n := rep.Violations(); n > 0 {
		problems = append(problems, fmt.Sprintf("%d run(s) exceeded their budget (peak > budget)", n))
	}
	if n := rep.Errors(); n > 0 {
		problems = append(problems, fmt.Sprintf("%d run(s) failed (status error; see the reason column of --csv/--json)", n))
		for _, t := range rep.Traces {
			for i := range t.Runs {
				if r := &t.Runs[i]; r.Status == sweep.StatusError {
					fmt.Fprintf(stderr, "memscale replay: %s %s %s: %s\n", r.Trace, r.Heuristic, sweep.FormatRatio(r.Ratio), r.Reason)
				}
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// memoryName is the report's name of a --memory value.
func memoryName(flag string) string {
	if flag == "allocator" {
		return "allocator"
	}
	return replay.Counting{}.Name()
}

// limitOrDefault is the overhead limit to show in tables.
func limitOrDefault(l float64) float64 {
	if l == 0 {
		return replay.DefaultOverheadLimit
	}
	return l
}

// writeReplayOutputs writes the CSV, JSON, Markdown and PNG files opened in
// outs.
func writeReplayOutputs(rep *sweep.Report, outs outputFiles) error {
	return outs.write(map[string]func(io.Writer) error{
		"csv":      func(w io.Writer) error { return sweep.WriteCSV(w, rep) },
		"json":     func(w io.Writer) error { return sweep.WriteJSON(w, rep) },
		"markdown": func(w io.Writer) error { return sweep.WriteMarkdown(w, rep, sweep.DTRReference()) },
		"plot":     func(w io.Writer) error { return writeOverheadPlot(w, rep) },
	})
}

// writeOverheadPlot draws overhead against budget ratio, one panel per trace
// and one line per heuristic; infeasible runs are crosses at the limit.
func writeOverheadPlot(w io.Writer, rep *sweep.Report) error {
	panels := make([]plot.Panel, 0, len(rep.Traces))
	for _, t := range rep.Traces {
		p := plot.Panel{Title: fmt.Sprintf("%s (baseline peak %s)", t.Name, sweep.FormatBytes(t.Baseline.Peak))}
		for _, h := range rep.Heuristics {
			s := plot.Series{Name: h}
			for i := range t.Runs {
				r := &t.Runs[i]
				if r.Heuristic != h {
					continue
				}
				s.Points = append(s.Points, plot.Point{X: r.Ratio, Y: r.Overhead, Missing: !r.Feasible()})
			}
			p.Series = append(p.Series, s)
		}
		panels = append(panels, p)
	}
	lo, hi := 1.0, 0.0
	for _, r := range rep.Ratios {
		lo, hi = min(lo, r), max(hi, r)
	}
	for _, t := range rep.Traces { // runs at absolute budgets: ratios of their own
		for i := range t.Runs {
			lo, hi = min(lo, t.Runs[i].Ratio), max(hi, t.Runs[i].Ratio)
		}
	}
	opt := plot.Options{
		XLabel: "budget / baseline peak", YLabel: "overhead (compute / baseline)",
		XMin: max(0, lo-0.05), XMax: hi + 0.05, YMin: 1, FixYMin: true,
		MissingLabel: "infeasible (OOM, limit)",
		Palette:      heuristicOrder(),
	}
	if rep.OverheadLimit > 0 {
		opt.Ceiling = rep.OverheadLimit
	}
	return plot.WritePNG(w, panels, opt)
}

// heuristicOrder lists every heuristic name, so that a heuristic has the
// same colour in every plot.
func heuristicOrder() []string {
	var names []string
	for _, h := range evict.Heuristics() {
		names = append(names, h.String())
	}
	return append(names, evict.Auto.String())
}

// progressLine is a status line rewritten in place with \r.
type progressLine struct {
	w     io.Writer
	width int // length of what is shown now
}

// maxProgressWidth keeps the line within a narrow terminal.
const maxProgressWidth = 79

func (p *progressLine) show(s string) {
	if r := []rune(s); len(r) > maxProgressWidth {
		s = string(r[:maxProgressWidth])
	}
	n := len([]rune(s))
	pad := ""
	if p.width > n {
		pad = strings.Repeat(" ", p.width-n)
	}
	fmt.Fprintf(p.w, "\r%s%s", s, pad)
	p.width = n
}

func (p *progressLine) clear() {
	if p.width == 0 {
		return
	}
	fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.width))
	p.width = 0
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
