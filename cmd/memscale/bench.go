package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"

	"github.com/schollz/progressbar/v3"

	"github.com/memscale/memscale/bench/replaybench"
	"github.com/memscale/memscale/bench/workload"
	"github.com/memscale/memscale/internal/config"
	"github.com/memscale/memscale/internal/sharedtraces"
	"github.com/memscale/memscale/internal/sweep"
)

func init() {
	register(command{
		name:    "bench",
		summary: "benchmark allocators: replay a PyTorch snapshot / trace / RMM log (replay), latency grid (micro)",
		run: func(args []string, stdout, stderr io.Writer) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
			defer stop()
			return benchCommand(ctx, args, stdout, stderr, benchEnv{shared: sharedtraces.List, isTTY: isTerminal})
		},
	})
}

// benchEnv is what the command takes from the process (tests fake it).
type benchEnv struct {
	shared sweep.SharedLister
	isTTY  func(w io.Writer) bool
}

const benchSynopsis = `bench replay INPUT... | bench micro   (memscale bench <sub> -h for the flags)`

// benchCommand dispatches `memscale bench SUB`.
func benchCommand(ctx context.Context, args []string, stdout, stderr io.Writer, env benchEnv) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		fmt.Fprintf(stdout, "usage: memscale %s\n\n  replay  replay the alloc/free stream of INPUT through several allocators\n  micro   allocation latency grid (sizes x threads x streams, cached/uncached)\n", benchSynopsis)
		if len(args) == 0 {
			return usagef("bench: want a subcommand (replay or micro)")
		}
		return nil
	}
	switch args[0] {
	case "replay":
		return benchReplay(ctx, args[1:], stdout, stderr, env)
	case "micro":
		return benchMicro(ctx, args[1:], stdout, stderr, env)
	}
	return usagef("bench: unknown subcommand %q (replay or micro)", args[0])
}

const benchReplaySynopsis = `bench replay INPUT... [--allocators memscale,torch,torch-expandable|all] [--torch-conf CONF]...
       [--backend sim|cuda] [--limit SIZE] [--device N] [--csv FILE] [--json FILE] [--plot FILE.png]
       [--markdown FILE] [--steps N] [--quiet]

INPUT is a PyTorch memory snapshot pickle (torch.cuda.memory._dump_snapshot after
_record_memory_history, or memscale.record_snapshot), a DTR/memscale trace (.log,
.log.gz), an RMM replay log (CSV), the name of a shared DTR trace, or all-shared.
Every allocation and free is replayed in order, on its stream, through each
allocator: memscale's (on the simulated device, or the GPU with --backend cuda)
and a model of PyTorch's native caching allocator ("torch", "torch-expandable",
"torch[PYTORCH_CUDA_ALLOC_CONF]"). --steps N replays each input N times in a
row through the same allocator (training steps of one process: memscale's allocator
is told where each begins) and shows the granules remapped in each step.`

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ";") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// benchReplay runs `memscale bench replay`.
func benchReplay(ctx context.Context, args []string, stdout, stderr io.Writer, env benchEnv) error {
	fs := newFlagSet("bench replay", benchReplaySynopsis, stdout)
	allocs := fs.String("allocators", strings.Join(replaybench.DefaultNames, ","), "comma list of allocators ("+strings.Join(replaybench.Names(), ", ")+"), or all")
	var torchConfs stringList
	fs.Var(&torchConfs, "torch-conf", "add the PyTorch model with this PYTORCH_CUDA_ALLOC_CONF (repeatable), e.g. max_split_size_mb:128,roundup_power2_divisions:4")
	backendName := fs.String("backend", "sim", "where memscale runs: sim (simulated device) or cuda (the first GPU; adds cuda-malloc)")
	limitS := fs.String("limit", "", "memory limit (e.g. 12GiB): report the first allocation each allocator could not serve under it")
	device := fs.Int("device", -1, "device whose history is read from a snapshot (-1 = the one with the most allocations)")
	csvPath := fs.String("csv", "", "write one row per workload and allocator to this CSV file")
	jsonPath := fs.String("json", "", "write the report, timelines included, to this JSON file")
	plotPath := fs.String("plot", "", "write a PNG of reserved memory over the replay (one line per allocator) to this file")
	mdPath := fs.String("markdown", "", "write Markdown tables (allocators side by side) to this file")
	quiet := fs.Bool("quiet", false, "no tables and no progress bar")
	steps := fs.Int("steps", 1, "replay each input this many times in a row through the same allocator and report maps, unmaps and remaps per step")
	exportDir := fs.String("export-rmm", "", "also write each input's alloc/free stream as an RMM replay log (DIR/NAME.csv), for RMM's REPLAY_BENCHMARK and bench/gpu/bench_replay.py")

	var inputs []string
	rest := args
	for {
		if err := parseFlags(fs, rest); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		inputs = append(inputs, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if *steps < 1 {
		return usagef("bench replay: --steps %d: want at least 1", *steps)
	}
	if len(inputs) == 0 {
		return usagef("bench replay: no INPUT (a snapshot pickle, a trace, an RMM log, a shared trace name or %s)", sweep.AllShared)
	}
	var specs []replaybench.Spec
	names := strings.Split(*allocs, ",")
	if strings.TrimSpace(*allocs) == "all" {
		names = nil
		for _, n := range replaybench.Names() {
			if n != "torch[CONF]" && (n != "cuda-malloc" || *backendName == "cuda") {
				names = append(names, n)
			}
		}
	}
	if *backendName == "cuda" && !contains(names, "cuda-malloc") {
		names = append(names, "cuda-malloc")
	}
	for _, c := range torchConfs {
		names = append(names, "torch["+c+"]")
	}
	for _, n := range names {
		s, err := replaybench.Lookup(strings.TrimSpace(n))
		if err != nil {
			return usagef("--allocators: %v", err)
		}
		specs = append(specs, s)
	}
	envOpt := replaybench.Env{Backend: replaybench.Backend(*backendName)}
	if envOpt.Backend != replaybench.BackendSim && envOpt.Backend != replaybench.BackendCUDA {
		return usagef("--backend %q: want sim or cuda", *backendName)
	}
	if *limitS != "" {
		l, err := config.ParseSize(*limitS)
		if err != nil {
			return usagef("--limit: %v", err)
		}
		envOpt.Limit = l
	}

	ws, err := replaybench.Load(inputs, env.shared, *device)
	if err != nil {
		return err
	}
	if *exportDir != "" {
		if err := exportRMM(*exportDir, ws); err != nil {
			return err
		}
	}
	outs, err := openOutputs(map[string]string{"csv": *csvPath, "json": *jsonPath, "plot": *plotPath, "markdown": *mdPath})
	if err != nil {
		return err
	}
	defer outs.abort()

	rep := &replaybench.Report{}
	showBar := !*quiet && env.isTTY != nil && env.isTTY(stderr)
	for _, w := range ws {
		info := replaybench.Info(w)
		rep.Workloads = append(rep.Workloads, info)
		// The simulated card holds the largest peak with room to spare.
		envOpt.Capacity = max(64<<30, 2*info.PeakRequested+(1<<30))
		var results []replaybench.Result
		for _, s := range specs {
			opt := replaybench.Options{Env: envOpt, Steps: *steps}
			var bar *progressbar.ProgressBar
			if showBar && len(w.Ops) >= 20000 {
				bar = progressbar.NewOptions(len(w.Ops), progressbar.OptionSetWriter(stderr),
					progressbar.OptionSetDescription(fmt.Sprintf("%s / %s", w.Name, s.Name)),
					progressbar.OptionShowCount(), progressbar.OptionClearOnFinish(), progressbar.OptionThrottle(100_000_000))
				opt.Progress = func(done, _ int) { _ = bar.Set(done) }
			}
			r, err := replaybench.RunOne(ctx, w, s, opt)
			if bar != nil {
				_ = bar.Finish()
			}
			if err != nil {
				return fmt.Errorf("%s: %w", w.Name, err)
			}
			results = append(results, r)
		}
		rep.Results = append(rep.Results, results...)
		if !*quiet {
			if err := replaybench.WriteTable(stdout, info, results); err != nil {
				return fmt.Errorf("writing the table: %w", err)
			}
		}
	}
	if err := outs.write(map[string]func(io.Writer) error{
		"csv":      func(f io.Writer) error { return replaybench.WriteCSV(f, rep) },
		"json":     func(f io.Writer) error { return replaybench.WriteJSON(f, rep) },
		"plot":     func(f io.Writer) error { return replaybench.WritePlot(f, rep) },
		"markdown": func(f io.Writer) error { return replaybench.WriteMarkdown(f, rep) },
	}); err != nil {
		return err
	}
	var failed []string
	for _, r := range rep.Results {
		if r.Error != "" {
			failed = append(failed, r.Workload+"/"+r.Allocator+": "+r.Error)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d replay(s) failed: %s", len(failed), strings.Join(failed, "; "))
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if strings.TrimSpace(x) == s {
			return true
		}
	}
	return false
}

// exportRMM writes each workload to dir/NAME.csv in RMM's log format.
func exportRMM(dir string, ws []*workload.Workload) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--export-rmm: %w", err)
	}
	for _, w := range ws {
		p := filepath.Join(dir, w.Name+".csv")
		f, err := os.Create(p)
		if err != nil {
			return fmt.Errorf("--export-rmm: %w", err)
		}
		werr := workload.WriteRMM(f, w)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return fmt.Errorf("--export-rmm %s: %w", p, werr)
		}
	}
	return nil
}
