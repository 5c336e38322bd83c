package replaybench

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/memscale/memscale/bench/workload"
	"github.com/memscale/memscale/internal/bytesize"
)

// Report is everything one `memscale bench replay` measured.
type Report struct {
	// Workloads describe the inputs, in order.
	Workloads []WorkloadInfo `json:"workloads"`
	// Results hold one entry per workload and allocator.
	Results []Result `json:"results"`
}

// WorkloadInfo describes one input.
type WorkloadInfo struct {
	// Name, Path and Format identify the input; Ops, Allocs and Streams
	// count its operations, allocations and streams; PeakRequested is its
	// peak of live requested bytes; Notes are the reader's remarks.
	Name          string   `json:"name"`
	Path          string   `json:"path"`
	Format        string   `json:"format"`
	Ops           int      `json:"ops"`
	Allocs        int      `json:"allocs"`
	Streams       int      `json:"streams"`
	PeakRequested uint64   `json:"peak_requested"`
	Notes         []string `json:"notes,omitempty"`
}

// Info describes w.
func Info(w *workload.Workload) WorkloadInfo {
	return WorkloadInfo{Name: w.Name, Path: w.Path, Format: w.Format, Ops: len(w.Ops), Allocs: w.Allocs,
		Streams: w.Streams, PeakRequested: w.PeakRequested(), Notes: w.Notes}
}

func fmtBytes(n uint64) string { return bytesize.Format(n, 2) }

func fmtDur(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%d ns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.1f us", float64(d)/1e3)
	}
	return fmt.Sprintf("%.2f ms", float64(d)/1e6)
}

// oomCell is the "first OOM" column.
func oomCell(r *Result) string {
	switch {
	case r.Limit == 0:
		return "-"
	case r.OOM == nil:
		return "never"
	}
	return fmt.Sprintf("op %d (%.1f%%, %s live)", r.OOM.Op, 100*r.OOM.Fraction, fmtBytes(r.OOM.Requested))
}

// WriteTable writes one aligned table per workload.
func WriteTable(w io.Writer, info WorkloadInfo, results []Result) error {
	fmt.Fprintf(w, "%s (%s, %d ops, %d allocations, %d stream(s), peak requested %s)\n",
		info.Name, info.Format, info.Ops, info.Allocs, info.Streams, fmtBytes(info.PeakRequested))
	for _, n := range info.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "allocator\tpeak reserved\tpeak allocated\tfragmentation\tdevice allocs\tmaps/unmaps/remaps\tmalloc p50\tp99\tmax\tops/s\tfirst OOM under limit\t")
	for i := range results {
		r := &results[i]
		if r.Workload != info.Name {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f%%\t%d\t%s\t%s\t%s\t%s\t%.0f\t%s\t\n", r.Allocator, fmtBytes(r.PeakReserved), fmtBytes(r.PeakAllocated),
			100*r.Fragmentation, r.DeviceAllocs, mapCell(r), fmtDur(r.MallocP50), fmtDur(r.MallocP99), fmtDur(r.MallocMax), r.OpsPerSec, oomCell(r))
		if r.Error != "" {
			fmt.Fprintf(tw, "  %s: ERROR %s\t\t\t\t\t\t\t\t\t\t\t\n", r.Allocator, r.Error)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w)
	return err
}

// csvHeader are the CSV columns.
var csvHeader = []string{"workload", "format", "allocator", "backend", "ops", "mallocs", "frees", "peak_requested", "peak_allocated",
	"peak_reserved", "fragmentation", "overhead", "device_allocs", "maps", "unmaps", "remaps", "malloc_p50_ns", "malloc_p99_ns", "malloc_max_ns", "ops_per_sec",
	"limit", "oom_op", "oom_fraction", "error"}

// WriteCSV writes one row per result.
func WriteCSV(w io.Writer, rep *Report) error {
	formats := map[string]string{}
	for _, i := range rep.Workloads {
		formats[i.Name] = i.Format
	}
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return err
	}
	u := func(n uint64) string { return strconv.FormatUint(n, 10) }
	for _, r := range rep.Results {
		oomOp, oomFrac := "", ""
		if r.OOM != nil {
			oomOp, oomFrac = strconv.Itoa(r.OOM.Op), strconv.FormatFloat(r.OOM.Fraction, 'f', 6, 64)
		}
		if err := cw.Write([]string{r.Workload, formats[r.Workload], r.Allocator, r.Backend, strconv.Itoa(r.Ops), strconv.Itoa(r.Mallocs),
			strconv.Itoa(r.Frees), u(r.PeakRequested), u(r.PeakAllocated), u(r.PeakReserved),
			strconv.FormatFloat(r.Fragmentation, 'f', 6, 64), strconv.FormatFloat(r.Overhead, 'f', 6, 64),
			strconv.FormatInt(r.DeviceAllocs, 10), strconv.FormatInt(r.Maps, 10), strconv.FormatInt(r.Unmaps, 10),
			strconv.FormatInt(r.Remaps, 10), strconv.FormatInt(r.MallocP50.Nanoseconds(), 10),
			strconv.FormatInt(r.MallocP99.Nanoseconds(), 10), strconv.FormatInt(r.MallocMax.Nanoseconds(), 10),
			strconv.FormatFloat(r.OpsPerSec, 'f', 0, 64), u(r.Limit), oomOp, oomFrac, r.Error}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteJSON writes the report (timelines included).
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteMarkdown writes one Markdown table per workload: the allocators side
// by side on peak reserved and fragmentation.
func WriteMarkdown(w io.Writer, rep *Report) error {
	var b strings.Builder
	writeSummary(&b, rep)
	for _, info := range rep.Workloads {
		fmt.Fprintf(&b, "### %s\n\n%s, %d ops, %d allocations, %d stream(s), peak requested %s.\n\n",
			info.Name, info.Format, info.Ops, info.Allocs, info.Streams, fmtBytes(info.PeakRequested))
		b.WriteString("| allocator | peak reserved | peak allocated | fragmentation | vs memscale | device allocs | maps / unmaps / remaps | malloc p50 / p99 | first OOM under limit |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
		var ref uint64
		for _, r := range rep.Results {
			if r.Workload == info.Name && r.Allocator == "memscale" {
				ref = r.PeakReserved
			}
		}
		for i := range rep.Results {
			r := &rep.Results[i]
			if r.Workload != info.Name {
				continue
			}
			vs := "-"
			if ref > 0 {
				vs = fmt.Sprintf("%+.1f%%", 100*(float64(r.PeakReserved)/float64(ref)-1))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %.2f%% | %s | %d | %s | %s / %s | %s |\n", r.Allocator, fmtBytes(r.PeakReserved),
				fmtBytes(r.PeakAllocated), 100*r.Fragmentation, vs, r.DeviceAllocs, mapCell(r), fmtDur(r.MallocP50), fmtDur(r.MallocP99), oomCell(r))
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// palette gives each allocator a fixed colour by its position in Names.
var palette = []color.RGBA{
	{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255},
}

// WritePlot draws reserved memory over the replay (percent of operations),
// one panel per workload and one line per allocator, as a PNG.
func WritePlot(w io.Writer, rep *Report) error {
	if len(rep.Workloads) == 0 {
		return fmt.Errorf("plot: no workloads")
	}
	const cols, pw, ph = 2, 640, 400
	ncols := min(cols, len(rep.Workloads))
	rows := (len(rep.Workloads) + ncols - 1) / ncols
	img := vgimg.NewWith(vgimg.UseWH(vg.Length(ncols*pw)*vg.Inch/96, vg.Length(rows*ph)*vg.Inch/96), vgimg.UseDPI(96))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: ncols, PadX: vg.Millimeter * 2, PadY: vg.Millimeter * 2, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	colours := map[string]color.RGBA{}
	for i, info := range rep.Workloads {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s: reserved memory (peak requested %s)", info.Name, fmtBytes(info.PeakRequested))
		p.X.Label.Text = "replay progress (% of alloc/free operations)"
		p.Y.Label.Text = "reserved (GiB)"
		p.Legend.Top = false
		p.Legend.Left = true
		p.Add(plotter.NewGrid())
		for j := range rep.Results {
			r := &rep.Results[j]
			if r.Workload != info.Name || len(r.Timeline) == 0 {
				continue
			}
			c, ok := colours[r.Allocator]
			if !ok {
				c = palette[len(colours)%len(palette)]
				colours[r.Allocator] = c
			}
			xys := make(plotter.XYs, len(r.Timeline))
			for k, pt := range r.Timeline {
				xys[k] = plotter.XY{X: 100 * float64(pt.Op+1) / float64(max(1, r.Ops)), Y: float64(pt.Reserved) / (1 << 30)}
			}
			l, err := plotter.NewLine(xys)
			if err != nil {
				return fmt.Errorf("plot %s %s: %w", info.Name, r.Allocator, err)
			}
			l.Color = c
			l.Width = vg.Points(1.2)
			p.Add(l)
			p.Legend.Add(fmt.Sprintf("%s (peak %s)", r.Allocator, fmtBytes(r.PeakReserved)), l)
		}
		p.Y.Min = 0
		p.X.Min, p.X.Max = 0, 100
		p.Draw(tiles.At(dc, i%ncols, i/ncols))
	}
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// writeSummary writes one row per workload with every allocator's peak
// reserved and fragmentation side by side.
func writeSummary(b *strings.Builder, rep *Report) {
	var allocs []string
	seen := map[string]bool{}
	for _, r := range rep.Results {
		if !seen[r.Allocator] {
			seen[r.Allocator] = true
			allocs = append(allocs, r.Allocator)
		}
	}
	b.WriteString("| workload | peak requested |")
	for _, a := range allocs {
		fmt.Fprintf(b, " %s: peak reserved (fragmentation) |", a)
	}
	b.WriteString("\n|---|---:|" + strings.Repeat("---:|", len(allocs)) + "\n")
	for _, info := range rep.Workloads {
		fmt.Fprintf(b, "| %s | %s |", info.Name, fmtBytes(info.PeakRequested))
		for _, a := range allocs {
			cell := " - |"
			for i := range rep.Results {
				if r := &rep.Results[i]; r.Workload == info.Name && r.Allocator == a {
					cell = fmt.Sprintf(" %s (%.2f%%) |", fmtBytes(r.PeakReserved), 100*r.Fragmentation)
				}
			}
			b.WriteString(cell)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

// mapCell formats the granules mapped, unmapped and remapped ("-" for an
// allocator that does not count them).
func mapCell(r *Result) string {
	if !r.Mapping {
		return "-"
	}
	s := fmt.Sprintf("%d / %d / %d", r.Maps, r.Unmaps, r.Remaps)
	if len(r.Steps) > 0 {
		per := make([]string, len(r.Steps))
		for i, st := range r.Steps {
			per[i] = strconv.FormatInt(st.Remaps, 10)
		}
		s += " (remaps per step: " + strings.Join(per, ", ") + ")"
	}
	return s
}
