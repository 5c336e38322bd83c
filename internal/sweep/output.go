package sweep

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/memscale/memscale/internal/bytesize"
)

// errWriter remembers the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

// OverheadCell is how tables show a run's overhead: the value for a finished
// run, ">Nx" past the overhead limit, "OOM" when nothing was evictable,
// "error" for a failed run.
func OverheadCell(r *RunResult, limit float64) string {
	switch r.Status {
	case StatusOK:
		return strconv.FormatFloat(r.Overhead, 'f', 3, 64)
	case "over-limit":
		return ">" + strconv.FormatFloat(limit, 'g', -1, 64) + "x"
	case "oom":
		return "OOM"
	}
	return r.Status
}

// WriteTable writes a trace's runs as an aligned table, followed by its
// Pareto frontier and its budget violations (loudly).
func WriteTable(w io.Writer, t *TraceReport, limit float64) error {
	ew := &errWriter{w: w}
	b := t.Baseline
	ew.printf("== %s (%s)\n", t.Name, t.Path)
	ew.printf("baseline: peak %s (%d B), compute %s, %d instructions (parse %s, replay %s)\n",
		FormatBytes(b.Peak), b.Peak, FormatDuration(time.Duration(b.Compute)), b.Instructions,
		FormatDuration(b.Parse), FormatDuration(b.Wall))
	header := []string{"heuristic", "ratio", "budget", "status", "overhead", "evictions", "remats", "peak", "search/mean", "wall"}
	right := []bool{false, true, true, false, true, true, true, true, true, true}
	labels := budgetLabels(t.Runs)
	for _, l := range labels {
		header, right = append(header, "violates_"+l), append(right, false)
	}
	rows := make([][]string, 0, len(t.Runs))
	for i := range t.Runs {
		r := &t.Runs[i]
		status := r.Status
		if r.BudgetViolated {
			status += " VIOLATED"
		}
		search := "-"
		if r.VictimSearches > 0 {
			search = FormatDuration(r.VictimSearchMean)
		}
		row := []string{
			HeuristicCell(r), ratioCell(r), budgetCell(r), status, OverheadCell(r, limit),
			strconv.FormatInt(r.Evictions, 10), strconv.FormatInt(r.Rematerializations, 10),
			FormatBytes(r.Peak), search, FormatDuration(r.Wall),
		}
		for _, l := range labels {
			row = append(row, strconv.FormatBool(r.Violates["violates_"+l]))
		}
		rows = append(rows, row)
	}
	if ew.err == nil {
		ew.err = writeAligned(w, header, right, rows)
	}
	ew.printf("Pareto frontier (budget vs overhead, across heuristics):")
	if len(t.Frontier) == 0 {
		ew.printf(" none (no run finished)\n")
	} else {
		ew.printf("\n")
		fr := make([][]string, 0, len(t.Frontier))
		for _, i := range t.Frontier {
			r := &t.Runs[i]
			fr = append(fr, []string{"", ratioCell(r), budgetCell(r), OverheadCell(r, limit), HeuristicCell(r)})
		}
		if ew.err == nil {
			ew.err = writeAligned(w, []string{"", "ratio", "budget", "overhead", "heuristic"}, []bool{false, true, true, true, false}, fr)
		}
	}
	if len(t.Violations) == 0 {
		ew.printf("budget violations: none\n")
	} else {
		ew.printf("!!! BUDGET VIOLATED in %d run(s) of %s (peak above budget; this is a bug):\n", len(t.Violations), t.Name)
		for _, i := range t.Violations {
			ew.printf("!!!   %s\n", ViolationLine(&t.Runs[i]))
		}
	}
	ew.printf("\n")
	return ew.err
}

// ratioCell is how tables show a run's ratio: as given, or for a run at an
// absolute budget (whose ratio is budget / peak) with three decimals.
func ratioCell(r *RunResult) string {
	if r.BudgetLabel == "" {
		return FormatRatio(r.Ratio)
	}
	return strconv.FormatFloat(r.Ratio, 'f', 3, 64)
}

// budgetCell is how tables show a run's budget: its size, and the label of
// an absolute budget ("24.00 GiB (24GiB)").
func budgetCell(r *RunResult) string {
	if r.BudgetLabel == "" {
		return FormatBytes(r.Budget)
	}
	return FormatBytes(r.Budget) + " (" + r.BudgetLabel + ")"
}

// budgetLabels are the labels of the absolute budgets among runs, in the
// order they were given (each heuristic's runs list them in that order).
func budgetLabels(runs []RunResult) []string {
	var out []string
	seen := map[string]bool{}
	for i := range runs {
		if l := runs[i].BudgetLabel; l != "" && !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	return out
}

// HeuristicCell names a run's heuristic; for the auto policy with the
// configuration it chose ("auto: dtr[t=2]").
func HeuristicCell(r *RunResult) string {
	if r.Tuned == "" {
		return r.Heuristic
	}
	return r.Heuristic + ": " + r.Tuned
}

// ViolationLine describes a budget violation.
func ViolationLine(r *RunResult) string {
	return fmt.Sprintf("%s %s ratio %s: peak %d B > budget %d B (by %d B)",
		r.Trace, r.Heuristic, FormatRatio(r.Ratio), r.Peak, r.Budget, r.Peak-r.Budget)
}

// writeAligned writes rows under header, padding columns to their widest
// cell; right selects right alignment per column.
func writeAligned(w io.Writer, header []string, right []bool, rows [][]string) error {
	width := make([]int, len(header))
	for _, row := range append([][]string{header}, rows...) {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var sb strings.Builder
	line := func(row []string) {
		for i, c := range row {
			if i > 0 {
				sb.WriteString("  ")
			}
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if right[i] {
				sb.WriteString(pad + c)
			} else if i < len(row)-1 {
				sb.WriteString(c + pad)
			} else {
				sb.WriteString(c)
			}
		}
		sb.WriteString("\n")
	}
	line(header)
	for _, r := range rows {
		line(r)
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

// csvHeader are the CSV columns.
var csvHeader = []string{
	"trace", "path", "baseline_peak_bytes", "baseline_compute_ns", "heuristic", "ratio", "budget_bytes", "memory",
	"status", "reason", "overhead", "compute_ns", "evictions", "eager_evictions", "banished", "rematerializations",
	"swaps_out", "swaps_in", "peak_bytes", "victim_searches", "victim_search_ns", "victim_search_mean_ns",
	"instructions", "wall_ns", "budget_violated", "pareto", "close_error",
	"tuned", "tune_ns", "first_step_status", "first_step_overhead",
}

// WriteCSV writes every run of the report, one row each, with a header.
// With absolute budgets (Report.Budgets) a budget_label column and one
// violates_<label> column per budget follow csvHeader's.
func WriteCSV(w io.Writer, rep *Report) error {
	cw := csv.NewWriter(w)
	header := csvHeader
	if len(rep.Budgets) > 0 {
		header = append(append([]string(nil), csvHeader...), "budget_label")
		for _, b := range rep.Budgets {
			header = append(header, "violates_"+b.Label)
		}
	}
	if err := cw.Write(header); err != nil {
		return fmt.Errorf("writing CSV: %w", err)
	}
	i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
	u64 := func(v uint64) string { return strconv.FormatUint(v, 10) }
	for _, t := range rep.Traces {
		for i := range t.Runs {
			r := &t.Runs[i]
			rec := []string{
				t.Name, t.Path, u64(t.Baseline.Peak), i64(t.Baseline.Compute), r.Heuristic,
				strconv.FormatFloat(r.Ratio, 'g', -1, 64), u64(r.Budget), r.Memory, r.Status, r.Reason,
				strconv.FormatFloat(r.Overhead, 'g', -1, 64), i64(r.Compute), i64(r.Evictions), i64(r.EagerEvictions),
				i64(r.Banished), i64(r.Rematerializations), i64(r.SwapsOut), i64(r.SwapsIn), u64(r.Peak),
				i64(r.VictimSearches), i64(int64(r.VictimSearchTime)), i64(int64(r.VictimSearchMean)),
				strconv.Itoa(r.Instructions), i64(int64(r.Wall)), strconv.FormatBool(r.BudgetViolated), strconv.FormatBool(r.Pareto),
				r.CloseError, r.Tuned, i64(int64(r.TuneWall)), r.FirstStepStatus,
				strconv.FormatFloat(r.FirstStepOverhead, 'g', -1, 64),
			}
			if len(rep.Budgets) > 0 {
				rec = append(rec, r.BudgetLabel)
				for _, b := range rep.Budgets {
					rec = append(rec, strconv.FormatBool(r.Violates["violates_"+b.Label]))
				}
			}
			if err := cw.Write(rec); err != nil {
				return fmt.Errorf("writing CSV: %w", err)
			}
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("writing CSV: %w", err)
	}
	return nil
}

// WriteJSON writes the report as indented JSON.
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("writing JSON: %w", err)
	}
	return nil
}

// FormatRatio formats a budget ratio with at least two decimals ("0.30").
func FormatRatio(r float64) string {
	s := strconv.FormatFloat(r, 'f', -1, 64)
	if t := strconv.FormatFloat(r, 'f', 2, 64); len(t) >= len(s) {
		return t
	}
	return s
}

// FormatBytes formats a byte count with a binary unit and two decimals.
func FormatBytes(n uint64) string { return bytesize.Format(n, 2) }

// FormatDuration formats a duration with three significant digits in a
// fitting unit ("870ns", "12.3µs", "4.56ms", "1.23s").
func FormatDuration(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", int64(d))
	case d < time.Millisecond:
		return sig3(float64(d)/float64(time.Microsecond)) + "µs"
	case d < time.Second:
		return sig3(float64(d)/float64(time.Millisecond)) + "ms"
	}
	return sig3(d.Seconds()) + "s"
}

func sig3(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}
