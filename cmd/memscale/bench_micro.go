package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/memscale/memscale/bench/micro"
	"github.com/memscale/memscale/device"
	"github.com/memscale/memscale/device/backend"
	"github.com/memscale/memscale/device/sim"
	"github.com/memscale/memscale/internal/bytesize"
	"github.com/memscale/memscale/internal/config"
)

const benchMicroSynopsis = `bench micro [--sizes 512,4KiB,...,1GiB] [--threads 1,4,16] [--streams 1,4] [--patterns pairs,random]
       [--cached both|yes|no] [--iterations N] [--backend sim|cuda] [--csv FILE] [--json FILE] [--quiet]

The latency grid of memscale's allocator: every size x threads x streams x
cached/uncached x pattern cell runs on a fresh allocator. "pairs" is malloc then
free of the same block; "random" interleaves random-size allocations (up to the
cell's size) with frees of random live blocks, as RMM's random_allocations.
"uncached" empties the cache before every malloc (untimed), so each malloc gets
memory from the device. Latencies are allocator time from Go; the C-ABI
crossing that libmemscale.so adds per call is measured and shown separately.`

// microResult is one row of the JSON output.
type microReport struct {
	Backend    string         `json:"backend"`
	GoToCNs    int64          `json:"go_to_c_ns"`
	CToGoNs    int64          `json:"c_to_go_ns"`
	Results    []micro.Result `json:"results"`
	Iterations int            `json:"iterations"`
}

// benchMicro runs `memscale bench micro`.
func benchMicro(ctx context.Context, args []string, stdout, stderr io.Writer, env benchEnv) error {
	fs := newFlagSet("bench micro", benchMicroSynopsis, stdout)
	sizesS := fs.String("sizes", "512,4KiB,32KiB,256KiB,2MiB,16MiB,128MiB,1GiB", "request sizes (comma list)")
	threadsS := fs.String("threads", "1,4,16", "thread counts (comma list)")
	streamsS := fs.String("streams", "1,4", "stream counts (comma list); thread t uses stream t mod streams")
	patternsS := fs.String("patterns", "pairs,random", "pairs and/or random")
	cachedS := fs.String("cached", "both", "cached cells (yes), uncached (no) or both")
	iters := fs.Int("iterations", 2000, "malloc+free pairs (or random steps) per thread and cell; uncached and >= 64 MiB cells run a tenth")
	backendName := fs.String("backend", "sim", "sim (simulated device) or cuda (the first GPU)")
	csvPath := fs.String("csv", "", "write the grid to this CSV file")
	jsonPath := fs.String("json", "", "write the grid to this JSON file")
	quiet := fs.Bool("quiet", false, "no table and no progress line")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("bench micro takes no arguments, got %q", fs.Args())
	}
	var o micro.Options
	for _, s := range splitList(*sizesS) {
		n, err := config.ParseSize(s)
		if err != nil || n == 0 {
			return usagef("--sizes: %q is not a size (e.g. 512, 4KiB, 1GiB)", s)
		}
		o.Sizes = append(o.Sizes, n)
	}
	var err error
	if o.Threads, err = parseInts("--threads", *threadsS); err != nil {
		return err
	}
	if o.Streams, err = parseInts("--streams", *streamsS); err != nil {
		return err
	}
	for _, p := range splitList(*patternsS) {
		if p != string(micro.Pairs) && p != string(micro.Random) {
			return usagef("--patterns: %q (want pairs or random)", p)
		}
		o.Patterns = append(o.Patterns, micro.Pattern(p))
	}
	switch *cachedS {
	case "both":
	case "yes":
		o.Cached = []bool{true}
	case "no":
		o.Cached = []bool{false}
	default:
		return usagef("--cached %q: want both, yes or no", *cachedS)
	}
	if *iters < 1 {
		return usagef("--iterations %d: must be at least 1", *iters)
	}
	o.Iterations = *iters
	switch *backendName {
	case "sim":
		o.NewDevice = func() (device.Device, error) {
			return backend.Open(backend.Sim, 0, sim.Config{Capacity: 64 << 30}, nil)
		}
	case "cuda":
		if _, err := backend.Choose(backend.CUDA); err != nil {
			return fmt.Errorf("--backend cuda needs an NVIDIA GPU and its driver (libcuda.so.1): %w", err)
		}
		o.NewDevice = func() (device.Device, error) { return backend.Open(backend.CUDA, 0, sim.Config{}, nil) }
		o.Streams = []int{1} // the replay creates no CUDA streams: everything on the default stream
	default:
		return usagef("--backend %q: want sim or cuda", *backendName)
	}
	outs, err := openOutputs(map[string]string{"csv": *csvPath, "json": *jsonPath})
	if err != nil {
		return err
	}
	defer outs.abort()
	progress := &progressLine{w: stderr}
	if !*quiet && env.isTTY != nil && env.isTTY(stderr) {
		o.Progress = func(done, total int, c micro.Cell) {
			progress.show(fmt.Sprintf("[%d/%d] %s %s x%d threads %d streams cached=%v", done, total, c.Pattern, bytesize.Format(c.Size, 0), c.Threads, c.Streams, c.Cached))
		}
	}
	g2c, c2g := micro.CrossingCost(200000)
	res, err := micro.Run(ctx, o)
	progress.clear()
	if err != nil {
		return err
	}
	rep := &microReport{Backend: *backendName, GoToCNs: g2c.Nanoseconds(), CToGoNs: c2g.Nanoseconds(), Results: res, Iterations: *iters}
	if !*quiet {
		if err := writeMicroTable(stdout, rep); err != nil {
			return fmt.Errorf("writing the table: %w", err)
		}
	}
	if err := outs.write(map[string]func(io.Writer) error{
		"csv": func(w io.Writer) error { return writeMicroCSV(w, rep) },
		"json": func(w io.Writer) error {
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			return enc.Encode(rep)
		},
	}); err != nil {
		return err
	}
	var failed []string
	for _, r := range res {
		if r.Error != "" {
			failed = append(failed, fmt.Sprintf("%s %s x%d/%d cached=%v: %s", r.Pattern, bytesize.Format(r.Size, 0), r.Threads, r.Streams, r.Cached, r.Error))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d cell(s) failed: %s", len(failed), strings.Join(failed, "; "))
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseInts(flag, s string) ([]int, error) {
	var out []int
	for _, p := range splitList(s) {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return nil, usagef("%s: %q is not a positive whole number", flag, p)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, usagef("%s: empty list", flag)
	}
	return out, nil
}

func ns(d time.Duration) string { return strconv.FormatInt(d.Nanoseconds(), 10) }

func writeMicroTable(w io.Writer, rep *microReport) error {
	fmt.Fprintf(w, "memscale allocator latency grid, backend %s (allocator time from Go, ns per call)\n", rep.Backend)
	fmt.Fprintf(w, "C-ABI crossings, counted apart: C->Go %d ns per memscale_malloc/memscale_free call (add 2 per pair through libmemscale.so), Go->C %d ns\n",
		rep.CToGoNs, rep.GoToCNs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pattern\tcached\tsize\tthreads\tstreams\tcalls\tp50\tp99\tmax\tmalloc p50\tcalls/s\tC-ABI +ns/call\t")
	for _, r := range rep.Results {
		cached := "no"
		if r.Cached {
			cached = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%.0f\t%d\t\n", r.Pattern, cached, bytesize.Format(r.Size, 0), r.Threads, r.Streams,
			r.Ops, ns(r.P50), ns(r.P99), ns(r.Max), ns(r.MallocP50), r.OpsPerSec, rep.CToGoNs)
		if r.Error != "" {
			fmt.Fprintf(tw, "  ERROR: %s\t\t\t\t\t\t\t\t\t\t\t\t\n", r.Error)
		}
	}
	return tw.Flush()
}

func writeMicroCSV(w io.Writer, rep *microReport) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"backend", "pattern", "cached", "size", "threads", "streams", "calls", "p50_ns", "p99_ns", "max_ns", "malloc_p50_ns", "calls_per_sec", "c_to_go_ns_per_call", "error"})
	for _, r := range rep.Results {
		_ = cw.Write([]string{rep.Backend, string(r.Pattern), strconv.FormatBool(r.Cached), strconv.FormatUint(r.Size, 10), strconv.Itoa(r.Threads),
			strconv.Itoa(r.Streams), strconv.Itoa(r.Ops), ns(r.P50), ns(r.P99), ns(r.Max), ns(r.MallocP50),
			strconv.FormatFloat(r.OpsPerSec, 'f', 0, 64), strconv.FormatInt(rep.CToGoNs, 10), r.Error})
	}
	cw.Flush()
	return cw.Error()
}
