package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"

	"github.com/memscale/memscale/bench/replaybench"
	"github.com/memscale/memscale/internal/config"
	"github.com/memscale/memscale/internal/placement"
	"github.com/memscale/memscale/internal/planner"
	"github.com/memscale/memscale/internal/plot"
	"github.com/memscale/memscale/internal/sharedtraces"
	"github.com/memscale/memscale/internal/sweep"
	rc "github.com/memscale/memscale/recompute"
)

func init() {
	register(command{
		name:    "plan",
		summary: "will this training step fit on that GPU: peak, static placement, DTR's least budget and overhead, budgets, devices, batch sizes",
		run: func(args []string, stdout, stderr io.Writer) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
			defer stop()
			return planCommand(ctx, args, stdout)
		},
	})
}

const planSynopsis = `plan TRACE... [--budgets 24GiB,40GiB,80GiB] [--active 40GiB] [--device h100,l4|all]
       [--batch-sizes 8,16,32] [--info FILE.json,...] [--ratios 0.1..0.9] [--heuristic default|auto]
       [--max-overhead 1.3] [--overhead-limit 2] [--json FILE|-] [--plot FILE.png] [--list-devices]

TRACE is a training step recorded by memscale.plan or memscale.trace (a DTR
trace, .log or .log.gz), the name of a shared DTR trace, or a PyTorch memory
snapshot pickle (peak and placement only: a snapshot has no ops). Several
traces are one model at several batch sizes (--batch-sizes, in order).
TRACE.info.json, when it exists (memscale.plan writes it), gives the
parameters, gradients, optimizer state and where the op costs come from.`

// planOptions are the parsed command line.
type planOptions struct {
	traces      []string
	infos       []string
	batchSizes  []int
	opt         planner.Options
	json, plot  string
	listDevices bool
}

// parseBudgets parses a comma list of absolute sizes ("24GiB,40GiB").
func parseBudgets(flag, s string) ([]planner.Budget, error) {
	var out []planner.Budget
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		n, err := config.ParseSize(item)
		if err != nil || n == 0 {
			if err == nil {
				err = errors.New("a budget of 0 bytes")
			}
			return nil, fmt.Errorf("%s: %q: %v (want sizes such as 24GiB,40GiB or 500MB, or bytes)", flag, item, err)
		}
		out = append(out, planner.Budget{Label: strings.ReplaceAll(item, " ", ""), Bytes: n})
	}
	return out, nil
}

// parseBatchSizes parses "8,16,32".
func parseBatchSizes(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []int
	for _, item := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(item))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--batch-sizes: %q is not a positive integer (want a list such as 8,16,32)", item)
		}
		out = append(out, n)
	}
	return out, nil
}

func parsePlanArgs(args []string, stdout io.Writer) (planOptions, error) {
	fs := newFlagSet("plan", planSynopsis, stdout)
	budgets := fs.String("budgets", "", "memory budgets to track, a comma list of sizes (24GiB,40GiB,80GiB): violates_<budget> flags, and DTR at each")
	active := fs.String("active", "", "the active budget (a size): accepts the variants that fit it within --max-overhead")
	devices := fs.String("device", "", "devices to check, a comma list ("+strings.Join(planner.DeviceKeys(), ", ")+") or all")
	batches := fs.String("batch-sizes", "", "the batch size of each TRACE, in order (8,16,32): the largest batch each device fits")
	infos := fs.String("info", "", "model information JSON per TRACE, a comma list (default: TRACE.info.json when it exists)")
	ratios := fs.String("ratios", "0.1..0.9", "DTR budgets for the frontier, as ratios of the step's peak (a comma list; lo..hi/step ranges)")
	heur := fs.String("heuristic", "default", "the engine's policy for the replays ("+heuristicNames()+"); default: the engine's default heuristic, an upper bound of what auto reaches, 50x faster to replay; auto: the region's (a first step recorded and tuned, the step after it reported); every replay runs the region's engine configuration, rebuilds and pinned gradients")
	maxOver := fs.Float64("max-overhead", planner.DefaultMaxOverhead, "the overhead the active budget and the balanced profile accept")
	limit := fs.String("overhead-limit", "2", "abandon a replay past this overhead (> 1; 0, none or inf = no limit)")
	jsonPath := fs.String("json", "", "write the report as JSON to this file (- = stdout, instead of the text)")
	plotPath := fs.String("plot", "", "write a PNG of budget against overhead, devices marked")
	jobs := fs.Int("jobs", runtime.GOMAXPROCS(0), "replays in parallel")
	list := fs.Bool("list-devices", false, "print the device table (with --json - as JSON) and exit")
	noPlace := fs.Bool("no-placement", false, "skip the static placement (quadratic in the storages)")

	var opt planOptions
	traces, err := parseInterleaved(fs, args)
	if err != nil {
		return opt, err
	}
	opt.traces = traces
	opt.listDevices, opt.json, opt.plot = *list, *jsonPath, *plotPath
	if opt.listDevices {
		return opt, nil
	}
	if len(opt.traces) == 0 {
		return opt, usagef("no trace given (a trace recorded by memscale.plan or memscale.trace, a shared trace name, or a snapshot pickle)")
	}
	if opt.opt.Budgets, err = parseBudgets("--budgets", *budgets); err != nil {
		return opt, usageError{err.Error()}
	}
	if *active != "" {
		a, err := parseBudgets("--active", *active)
		if err != nil {
			return opt, usageError{err.Error()}
		}
		if len(a) != 1 {
			return opt, usagef("--active: %q: one size (such as 40GiB)", *active)
		}
		opt.opt.Active = &a[0]
	}
	if opt.opt.Devices, err = planner.ParseDevices(*devices); err != nil {
		return opt, usagef("--device: %v", err)
	}
	if opt.batchSizes, err = parseBatchSizes(*batches); err != nil {
		return opt, usageError{err.Error()}
	}
	if len(opt.batchSizes) > 0 && len(opt.batchSizes) != len(opt.traces) {
		return opt, usagef("--batch-sizes: %d sizes for %d traces (give one batch size per TRACE, in order)", len(opt.batchSizes), len(opt.traces))
	}
	if *infos != "" {
		opt.infos = strings.Split(*infos, ",")
		if len(opt.infos) != len(opt.traces) {
			return opt, usagef("--info: %d files for %d traces (one per TRACE)", len(opt.infos), len(opt.traces))
		}
	}
	if opt.opt.Ratios, err = sweep.ParseRatios(*ratios); err != nil {
		return opt, usagef("--ratios: %v", err)
	}
	hs, err := sweep.ParseHeuristics(*heur)
	if err != nil || len(hs) != 1 {
		if err == nil {
			err = errors.New("one heuristic")
		}
		return opt, usagef("--heuristic: %v", err)
	}
	opt.opt.Heuristic = hs[0]
	if !(*maxOver >= 1) {
		return opt, usagef("--max-overhead: %g: want a ratio >= 1 such as 1.3", *maxOver)
	}
	opt.opt.MaxOverhead = *maxOver
	if opt.opt.OverheadLimit, err = parseOverheadLimit(*limit); err != nil {
		return opt, usagef("--overhead-limit: %v", err)
	}
	if *jobs < 1 {
		return opt, usagef("--jobs: %d: must be at least 1", *jobs)
	}
	opt.opt.Workers, opt.opt.NoPlacement = *jobs, *noPlace
	return opt, nil
}

// readInfo reads a model information file; a missing default is no error.
func readInfo(path string, required bool) (planner.ModelInfo, error) {
	var info planner.ModelInfo
	b, err := os.ReadFile(path)
	if err != nil {
		if !required && errors.Is(err, os.ErrNotExist) {
			return info, nil
		}
		return info, fmt.Errorf("--info: %w", err)
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, fmt.Errorf("--info %s: not the JSON memscale.plan writes: %w", path, err)
	}
	return info, nil
}

// isSnapshot reports whether path is a pickle (a PyTorch snapshot).
func isSnapshot(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	head, _ := bufio.NewReader(f).Peek(1)
	return len(head) == 1 && head[0] == 0x80
}

// snapshotBuffers turns a snapshot's allocations into lifetimes.
func snapshotBuffers(path string) ([]placement.Buffer, error) {
	w, err := replaybench.ReadFile(path, "", -1)
	if err != nil {
		return nil, err
	}
	bufs := make([]placement.Buffer, w.Allocs)
	for i := range bufs {
		bufs[i].End = -1
	}
	for t, op := range w.Ops {
		if op.Free {
			bufs[op.ID].End = int64(t)
		} else {
			bufs[op.ID] = placement.Buffer{Size: op.Size, Start: int64(t), End: -1}
		}
	}
	for i := range bufs {
		if bufs[i].End < 0 {
			bufs[i].End = int64(len(w.Ops))
		}
	}
	return bufs, nil
}

func planCommand(ctx context.Context, args []string, stdout io.Writer) error {
	opt, err := parsePlanArgs(args, stdout)
	if err != nil {
		return err
	}
	if opt.listDevices {
		return listDevices(stdout, opt.json == "-")
	}
	inputs, err := sweep.Resolve(opt.traces, sharedtraces.List)
	if err != nil {
		return fmt.Errorf("%w (want a trace recorded by memscale.plan or memscale.trace, or a snapshot pickle)", err)
	}
	var reps []*planner.Report
	for i, in := range inputs {
		infoPath, required := in.Path+".info.json", false
		if opt.infos != nil {
			infoPath, required = strings.TrimSpace(opt.infos[i]), true
		}
		info, err := readInfo(infoPath, required)
		if err != nil {
			return err
		}
		if opt.batchSizes != nil {
			info.BatchSize = opt.batchSizes[i]
		}
		var rep *planner.Report
		if isSnapshot(in.Path) {
			bufs, err := snapshotBuffers(in.Path)
			if err != nil {
				return err
			}
			rep, err = planner.AnalyzeBuffers(in.Name, bufs, info, opt.opt)
			if err != nil {
				return err
			}
		} else {
			tr, err := rc.LoadTrace(in.Path)
			if err != nil {
				return fmt.Errorf("%s: %w", in.Path, err)
			}
			if rep, err = planner.Analyze(ctx, in.Name, tr, info, opt.opt); err != nil {
				return err
			}
		}
		reps = append(reps, rep)
	}
	var batches []planner.BatchPlan
	if len(reps) > 1 && len(opt.opt.Devices) > 0 {
		batches = planner.PlanBatches(reps)
	}
	if opt.plot != "" {
		if err := writePlanPlot(opt.plot, reps, opt.opt.Devices); err != nil {
			return err
		}
	}
	if opt.json != "" {
		doc := struct {
			Plans   []*planner.Report   `json:"plans"`
			Batches []planner.BatchPlan `json:"batches,omitempty"`
		}{reps, batches}
		var w io.Writer = stdout
		if opt.json != "-" {
			f, err := os.Create(opt.json)
			if err != nil {
				return fmt.Errorf("--json: %w", err)
			}
			defer f.Close()
			w = f
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", " ")
		if err := enc.Encode(doc); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
		if opt.json == "-" {
			return nil
		}
	}
	for _, r := range reps {
		if err := planner.WriteText(stdout, r); err != nil {
			return err
		}
	}
	if batches != nil {
		return planner.WriteBatches(stdout, batches)
	}
	return nil
}

// listDevices prints the device table.
func listDevices(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", " ")
		return enc.Encode(planner.Devices())
	}
	for _, d := range planner.Devices() {
		if _, err := fmt.Fprintf(w, "%-10s %-14s %s (%s usable)  bf16 %.0f TFLOP/s  fp32 %.1f TFLOP/s  %.2f TB/s\n", d.Key, d.Name,
			sweep.FormatBytes(d.Memory), sweep.FormatBytes(d.Usable()), d.DenseBF16/1e12, d.FP32/1e12, d.Bandwidth/1e12); err != nil {
			return err
		}
	}
	return nil
}

// writePlanPlot draws overhead against the budget in GiB, one line per
// plan, each device's usable memory a vertical line.
func writePlanPlot(path string, reps []*planner.Report, devices []planner.Device) error {
	p := plot.Panel{Title: "memscale plan: DTR overhead against budget"}
	ymax := 1.0
	for _, r := range reps {
		s := plot.Series{Name: r.Name}
		if r.Info.BatchSize > 0 {
			s.Name = fmt.Sprintf("%s batch %d", r.Name, r.Info.BatchSize)
		}
		for _, v := range r.Variants {
			x := float64(v.Budget) / (1 << 30)
			if v.Variant == "native" {
				x = float64(v.Peak) / (1 << 30)
			}
			s.Points = append(s.Points, plot.Point{X: x, Y: v.Overhead, Missing: v.Status != "ok"})
			if v.Status == "ok" {
				ymax = max(ymax, v.Overhead)
			}
		}
		sortPoints(s.Points)
		p.Series = append(p.Series, s)
	}
	for _, d := range devices {
		x := float64(d.Usable()) / (1 << 30)
		p.Series = append(p.Series, plot.Series{Name: d.Name + " usable", Points: []plot.Point{{X: x, Y: 1}, {X: x, Y: ymax}}})
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	err = plot.WritePNG(f, []plot.Panel{p}, plot.Options{XLabel: "budget (GiB)", YLabel: "step time / native (estimated)",
		YMin: 1, FixYMin: true, MissingLabel: "infeasible (OOM, over the limit)", Columns: 1})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	return nil
}

func sortPoints(pts []plot.Point) {
	for i := 1; i < len(pts); i++ {
		for j := i; j > 0 && pts[j].X < pts[j-1].X; j-- {
			pts[j], pts[j-1] = pts[j-1], pts[j]
		}
	}
}
