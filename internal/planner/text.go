package planner

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/memscale/memscale/internal/placement"
)

// AnalyzeBuffers plans a step known only by its allocations (a PyTorch
// memory snapshot): the peak and the static placement; the DTR parts need
// ops (ErrNoTrace) and are left out, budgets and devices checked natively.
func AnalyzeBuffers(name string, bufs []placement.Buffer, info ModelInfo, opt Options) (*Report, error) {
	if opt.MaxOverhead == 0 {
		opt.MaxOverhead = DefaultMaxOverhead
	}
	rep := &Report{Name: name, Source: "torch-snapshot", Info: info, MaxOverhead: opt.MaxOverhead}
	rep.Memory.TracePeak = placement.Peak(bufs, 0)
	rep.Memory.Peak = rep.Memory.TracePeak + info.OptimizerState
	if !opt.NoPlacement {
		if err := rep.place(bufs); err != nil {
			return nil, fmt.Errorf("plan %s: %w", name, err)
		}
	}
	rep.Memory.MinFeasibleBudget = rep.Memory.Peak // nothing can be evicted
	rep.fill(nil, opt)
	rep.Summary += " (" + ErrNoTrace.Error() + ".)"
	return rep, nil
}

// WriteText writes the report as the command line shows it.
func WriteText(w io.Writer, r *Report) error {
	var b strings.Builder
	m := &r.Memory
	fmt.Fprintf(&b, "== plan: %s (%s)\n", r.Name, r.Source)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "  %s\t%s\n", k, v) }
	if r.Info.Parameters > 0 || r.Info.OptimizerState > 0 {
		row("parameters", fb(r.Info.Parameters))
		row("gradients", fb(r.Info.Gradients))
		row("optimizer state", fb(r.Info.OptimizerState))
	}
	if r.Source == "dtr-trace" {
		row("constants (parameters, inputs)", fb(m.Constants))
		row("forward+backward peak", fb(m.TracePeak))
	}
	if r.Info.OptimizerStepPeak > 0 {
		row("optimizer step peak", fb(r.Info.OptimizerStepPeak))
	}
	row("peak, no eviction", fb(m.Peak))
	if m.Arena > 0 {
		row("static placement arena", fmt.Sprintf("%s for %d storages (fragmentation floor %.2f %%)", fb(m.Arena), m.Storages, 100*m.FragmentationFloor))
	}
	if r.Source == "dtr-trace" {
		row("DTR minimum budget", fmt.Sprintf("%s (engine's lower bound %s)", fb(m.MinFeasibleBudget), fb(m.MinBudgetLowerBound)))
		costs := r.Info.Costs
		if costs == "" {
			costs = "the trace's TIME fields"
		}
		row("step compute", fmt.Sprintf("%.3f ms (%s)", float64(r.StepNS)/1e6, costs))
	}
	tw.Flush()
	if len(r.Variants) > 1 {
		b.WriteString("variants (budget vs overhead; * = Pareto frontier")
		if r.Active != nil {
			fmt.Fprintf(&b, " of those the active budget %s accepts", r.Active.Label)
		}
		b.WriteString("):\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		hdr := "\tvariant\tbudget\tratio\tstatus\toverhead\tpeak\tevictions\tremats\t"
		var labels []string
		for _, f := range r.Budgets {
			labels = append(labels, "violates_"+f.Label)
			hdr += "violates_" + f.Label + "\t"
		}
		if r.Active != nil {
			hdr += "accepted\t"
		}
		fmt.Fprintln(tw, hdr)
		for _, v := range r.Variants {
			mark, budget := "", "-"
			if v.Pareto {
				mark = "*"
			}
			if v.Variant == "dtr" {
				budget = fb(v.Budget)
			}
			line := fmt.Sprintf("%s\t%s\t%s\t%.3f\t%s\t%.3f\t%s\t%d\t%d\t", mark, v.Variant, budget, v.Ratio, v.Status, v.Overhead, fb(v.Peak), v.Evictions, v.Rematerializations)
			for _, l := range labels {
				line += fmt.Sprintf("%t\t", v.Violates[l])
			}
			if v.Accepted != nil {
				line += fmt.Sprintf("%t\t", *v.Accepted)
			}
			fmt.Fprintln(tw, line)
		}
		tw.Flush()
	}
	fits := append(append([]Fit(nil), r.Budgets...), r.Devices...)
	if r.Active != nil {
		a := *r.Active
		a.Label += " (active)"
		fits = append(fits, a)
	}
	if len(fits) > 0 {
		b.WriteString("budgets and devices:\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  budget\tbytes\tnatively\tunder memscale\tprofile")
		for _, f := range fits {
			nat := "no"
			if f.Native {
				nat = "fits"
			}
			dtr := f.Status
			if f.Status == "ok" {
				dtr = fmt.Sprintf("%.3fx", f.Overhead)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", f.Label, fb(f.Budget), nat, dtr, f.Profile)
		}
		tw.Flush()
	}
	fmt.Fprintf(&b, "summary: %s\n", r.Summary)
	_, err := io.WriteString(w, b.String())
	return err
}

// BatchRow is one batch size's plan on one device.
type BatchRow struct {
	BatchSize int     `json:"batch_size"`
	Peak      uint64  `json:"peak_bytes"`
	Native    bool    `json:"fits_natively"`
	Status    string  `json:"dtr_status"`
	Overhead  float64 `json:"overhead"`
}

// BatchPlan is the largest batch that fits a device natively and under
// memscale within 1.1x and 1.3x (0 = none of those planned).
type BatchPlan struct {
	Device        Device     `json:"device"`
	Rows          []BatchRow `json:"rows"`
	LargestNative int        `json:"largest_native"`
	Largest11     int        `json:"largest_memscale_1_1x"`
	Largest13     int        `json:"largest_memscale_1_3x"`
}

// PlanBatches gathers the reports' device checks (each report one batch
// size, Info.BatchSize) into one BatchPlan per device.
func PlanBatches(reps []*Report) []BatchPlan {
	sorted := append([]*Report(nil), reps...)
	sort.SliceStable(sorted, func(a, b int) bool { return sorted[a].Info.BatchSize < sorted[b].Info.BatchSize })
	var out []BatchPlan
	if len(sorted) == 0 {
		return nil
	}
	for di, d := range sorted[0].Devices {
		bp := BatchPlan{Device: *d.Device}
		for _, r := range sorted {
			if di >= len(r.Devices) {
				continue
			}
			f := r.Devices[di]
			bs := r.Info.BatchSize
			bp.Rows = append(bp.Rows, BatchRow{BatchSize: bs, Peak: r.Memory.Peak, Native: f.Native, Status: f.Status, Overhead: f.Overhead})
			if f.Native {
				bp.LargestNative = max(bp.LargestNative, bs)
			}
			if f.Status == "ok" && f.Overhead <= 1.1 {
				bp.Largest11 = max(bp.Largest11, bs)
			}
			if f.Status == "ok" && f.Overhead <= 1.3 {
				bp.Largest13 = max(bp.Largest13, bs)
			}
		}
		out = append(out, bp)
	}
	return out
}

// WriteBatches writes the batch plans as a table.
func WriteBatches(w io.Writer, plans []BatchPlan) error {
	var b strings.Builder
	for _, p := range plans {
		fmt.Fprintf(&b, "batch sizes on %s (%s usable):\n", p.Device.Name, fb(p.Device.Usable()))
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  batch\tpeak\tnatively\tunder memscale")
		for _, r := range p.Rows {
			nat, dtr := "no", r.Status
			if r.Native {
				nat = "fits"
			}
			if r.Status == "ok" {
				dtr = fmt.Sprintf("%.3fx", r.Overhead)
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\n", r.BatchSize, fb(r.Peak), nat, dtr)
		}
		tw.Flush()
		fmt.Fprintf(&b, "  largest batch: natively %s; under memscale at <= 1.1x %s, at <= 1.3x %s\n",
			batchWord(p.LargestNative), batchWord(p.Largest11), batchWord(p.Largest13))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func batchWord(b int) string {
	if b == 0 {
		return "none of those planned"
	}
	return fmt.Sprint(b)
}
