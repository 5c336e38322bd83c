package sweep

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Reference holds published overheads to compare with: trace name ->
// heuristic name -> ratio (formatted by FormatRatio) -> cell text ("1.371",
// ">2x", "OOM").
type Reference map[string]map[string]map[string]string

// Get returns the reference cell for a run, if there is one.
func (r Reference) Get(trace, heuristic string, ratio float64) (string, bool) {
	c, ok := r[trace][heuristic][FormatRatio(ratio)]
	return c, ok
}

// has reports whether the reference has any number for heuristic h on
// trace.
func (r Reference) has(trace, h string) bool { return len(r[trace][h]) > 0 }

// DTRReference returns the overheads REFERENCE.md (section 5) gives for the
// five shared traces, replayed by the DTR authors' simulator (simrd,
// RuntimeV2EagerOptimized, abort above 2x), keyed by shared trace name.
func DTRReference() Reference {
	heur := []string{"dtr", "dtr-eq", "msps", "lru", "size"}
	rows := map[string][]string{
		"resnet32": {
			"0.2 1.371 1.332 1.431 >2x >2x",
			"0.4 1.140 1.140 1.146 >2x 1.738",
			"0.6 1.074 1.074 1.063 1.130 1.234",
			"0.8 1.025 1.025 1.024 1.067 1.065",
		},
		"tv_densenet121": {
			"0.2 1.679 1.616 1.465 >2x >2x",
			"0.4 1.271 1.293 1.232 >2x >2x",
			"0.6 1.141 1.141 1.114 >2x 1.211",
			"0.8 1.064 1.064 1.053 1.062 1.074",
		},
		"transformer": {
			"0.2 1.352 1.545 1.333 >2x >2x",
			"0.4 1.083 1.091 1.089 >2x 1.080",
			"0.6 1.044 1.044 1.048 1.134 1.053",
			"0.8 1.020 1.020 1.018 1.065 1.028",
		},
		"lstm": {
			"0.2 1.598 1.550 >2x OOM >2x",
			"0.4 1.143 1.159 1.121 >2x >2x",
			"0.6 1.042 1.042 1.057 >2x >2x",
			"0.8 1.028 1.027 1.031 1.086 >2x",
		},
		"unet": {
			"0.3 OOM OOM 1.585 >2x OOM",
			"0.4 OOM OOM 1.241 OOM OOM",
			"0.5 1.159 1.159 1.132 >2x 1.659",
			"0.6 1.131 1.149 1.088 1.225 1.592",
			"0.8 1.058 1.058 1.033 1.062 1.128",
		},
	}
	ref := Reference{}
	for trace, lines := range rows {
		ref[trace] = map[string]map[string]string{}
		for _, line := range lines {
			f := strings.Fields(line)
			ratio, err := strconv.ParseFloat(f[0], 64)
			if err != nil || len(f) != len(heur)+1 {
				panic(fmt.Sprintf("sweep: bad reference row %q", line))
			}
			for i, h := range heur {
				if ref[trace][h] == nil {
					ref[trace][h] = map[string]string{}
				}
				ref[trace][h][FormatRatio(ratio)] = f[i+1]
			}
		}
	}
	return ref
}

// WriteMarkdown writes, per trace, a Markdown table of overheads: one row
// per ratio, one column per heuristic, and beside each heuristic that ref
// has numbers for on that trace, a "(ref)" column with them ("" where the
// reference has no number for that ratio). ref may be nil.
func WriteMarkdown(w io.Writer, rep *Report, ref Reference) error {
	ew := &errWriter{w: w}
	engine := "memscale default"
	if rep.SimulatorCompat {
		engine = "simulator-compatible"
	}
	limit := "none"
	if rep.OverheadLimit > 0 {
		limit = strconv.FormatFloat(rep.OverheadLimit, 'g', -1, 64) + "x"
	}
	ew.printf("Memory model: %s; engine: %s; overhead limit: %s.\n\n", rep.Memory, engine, limit)
	for _, t := range rep.Traces {
		ew.printf("### %s\n\n", t.Name)
		ew.printf("Baseline: peak %s (%d B), compute %.3f ms. Cells: overhead (compute / baseline compute); "+
			"`>%gx` = stopped at the overhead limit, `OOM` = nothing left to evict; **bold** = on the Pareto frontier.\n\n",
			FormatBytes(t.Baseline.Peak), t.Baseline.Peak, float64(t.Baseline.Compute)/1e6, rep.OverheadLimit)
		cols := []string{"ratio"}
		type col struct {
			h   string
			ref bool
		}
		var cs []col
		for _, h := range rep.Heuristics {
			cs = append(cs, col{h: h})
			cols = append(cols, h)
			if ref.has(t.Name, h) {
				cs = append(cs, col{h: h, ref: true})
				cols = append(cols, h+" (ref)")
			}
		}
		ew.printf("| %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
		byKey := map[string]*RunResult{}
		for i := range t.Runs {
			r := &t.Runs[i]
			byKey[r.Heuristic+"@"+FormatRatio(r.Ratio)] = r
		}
		for _, ratio := range rep.Ratios {
			cells := []string{FormatRatio(ratio)}
			for _, c := range cs {
				if c.ref {
					v, _ := ref.Get(t.Name, c.h, ratio)
					cells = append(cells, v)
					continue
				}
				r := byKey[c.h+"@"+FormatRatio(ratio)]
				switch {
				case r == nil:
					cells = append(cells, "")
				case r.Pareto:
					cells = append(cells, "**"+OverheadCell(r, rep.OverheadLimit)+"**")
				default:
					cells = append(cells, OverheadCell(r, rep.OverheadLimit))
				}
			}
			ew.printf("| %s |\n", strings.Join(cells, " | "))
		}
		ew.printf("\n")
	}
	return ew.err
}
