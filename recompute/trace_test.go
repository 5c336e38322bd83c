package recompute

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/memscale/memscale/internal/sharedtraces"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const start = `{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}`

func lines(ls ...string) string { return strings.Join(ls, "\n") + "\n" }

func parse(t *testing.T, s string) (*Trace, error) {
	t.Helper()
	return ReadTrace(strings.NewReader(s), ParseOptions{})
}

// TestParseValid covers every instruction on a small trace.
func TestParseValid(t *testing.T) {
	src := lines(
		`{"INSTRUCTION":"CONSTANT","NAME":"ignored"}`, // before START: skipped
		`{"INSTRUCTION":"MEMORY","NAME":"ignored","MEMORY":"1"}`,
		start,
		`{"INSTRUCTION":"CONSTANT","NAME":"w"}`,
		`{"INSTRUCTION":"MEMORY","NAME":"w","MEMORY":"100"}`,
		`{"INSTRUCTION":"COPY","DST":"w2","SRC":"w"}`,
		`{"INSTRUCTION":"CALL","NAME":"split","ARGS":["w"],"RESULT":["a","b"],"TIME":"50"}`,
		`{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"40"}`,
		`{"INSTRUCTION":"ALIAS","NAME":"a","ALIAS":"-1"}`,
		`{"INSTRUCTION":"MEMORY","NAME":"b","MEMORY":"999"}`,
		`{"INSTRUCTION":"ALIAS","NAME":"b","ALIAS":"0"}`,
		`{"INSTRUCTION":"ANNOTATE","ANNOTATION":"BACKWARD"}`,
		`{"INSTRUCTION":"MUTATE","NAME":"add_","ARGS":["a","w"],"MUTATE":[0],"TIME":7}`,
		`{"INSTRUCTION":"COPY_FROM","DST":"w2","SRC":"a"}`,
		`{"INSTRUCTION":"RELEASE","NAME":"nobody"}`,
		`{"INSTRUCTION":"RELEASE","NAME":"b"}`,
		``,
	)
	tr, err := parse(t, src)
	require.NoError(t, err)
	assert.Equal(t, 3, tr.StartLine)
	assert.Equal(t, 1, tr.IgnoredReleases)
	require.Equal(t, 7, tr.Len())
	assert.Equal(t, []string{"w", "a", "b", "a$"}, tr.Names)

	c := tr.At(0)
	assert.Equal(t, Instr{Kind: KindConstant, Line: 4, T: 0, Size: 100}, c)
	assert.Equal(t, KindCopy, tr.At(1).Kind)
	assert.Equal(t, int32(0), tr.At(1).T)

	call := tr.At(2)
	assert.Equal(t, KindCall, call.Kind)
	assert.Equal(t, 7, call.Line)
	assert.Equal(t, "split", call.Op)
	assert.Equal(t, int64(50), call.Time)
	assert.Equal(t, []int32{0}, call.Args)
	assert.Equal(t, []Out{{T: 1, Size: 40, Alias: -1}, {T: 2, Size: 0, Alias: 0}}, call.Outs)

	assert.Equal(t, KindAnnotate, tr.At(3).Kind)
	assert.Equal(t, AnnotationBackward, tr.At(3).Op)

	mut := tr.At(4)
	assert.Equal(t, KindMutate, mut.Kind)
	assert.Equal(t, []int32{1, 0}, mut.Args)
	assert.Equal(t, []int32{0}, mut.Mutated)
	// the new version of a has a's storage size (40)
	assert.Equal(t, []Out{{T: 3, Size: 40, Alias: -1}}, mut.Outs)

	cf := tr.At(5)
	assert.Equal(t, KindCopyFrom, cf.Kind)
	assert.Equal(t, int32(3), cf.T, "w2 now names a's new version")
	assert.Equal(t, int32(0), cf.Old)

	assert.Equal(t, Instr{Kind: KindRelease, Line: 16, T: 2}, tr.At(6))
	// still referenced at the end: w (one ref left), a$ (two: a and w2)
	assert.Equal(t, []int32{0, 3}, tr.Outputs)
}

// TestParseErrors checks that every malformed line is rejected with its
// line number and the reason.
func TestParseErrors(t *testing.T) {
	constW := []string{`{"INSTRUCTION":"CONSTANT","NAME":"w"}`, `{"INSTRUCTION":"MEMORY","NAME":"w","MEMORY":"8"}`}
	with := func(ls ...string) string { return lines(append(append([]string{start}, constW...), ls...)...) }
	tests := []struct {
		name   string
		src    string
		line   int
		reason string
	}{
		{"bad JSON", with(`{"INSTRUCTION":"CALL",`), 4, "bad JSON"},
		{"not an object", with(`[1,2]`), 4, "bad JSON"},
		{"unknown instruction", with(`{"INSTRUCTION":"JUMP"}`), 4, `unknown instruction "JUMP"`},
		{"missing instruction", with(`{"NAME":"x"}`), 4, "missing field INSTRUCTION"},
		{"missing name", with(`{"INSTRUCTION":"RELEASE"}`), 4, "missing field NAME"},
		{"missing args", with(`{"INSTRUCTION":"CALL","NAME":"f","RESULT":["x"],"TIME":"1"}`), 4, "missing field ARGS"},
		{"missing result", with(`{"INSTRUCTION":"CALL","NAME":"f","ARGS":[],"TIME":"1"}`), 4, "missing field RESULT"},
		{"missing time", with(`{"INSTRUCTION":"CALL","NAME":"f","ARGS":[],"RESULT":[]}`), 4, "missing field TIME"},
		{"non-numeric time", with(`{"INSTRUCTION":"CALL","NAME":"f","ARGS":[],"RESULT":[],"TIME":"fast"}`), 4, `non-numeric TIME "fast"`},
		{"negative time", with(`{"INSTRUCTION":"CALL","NAME":"f","ARGS":[],"RESULT":[],"TIME":"-3"}`), 4, "negative TIME"},
		{"non-numeric memory", lines(start, `{"INSTRUCTION":"CONSTANT","NAME":"w"}`, `{"INSTRUCTION":"MEMORY","NAME":"w","MEMORY":"lots"}`), 3, `non-numeric MEMORY "lots"`},
		{"memory as bool", lines(start, `{"INSTRUCTION":"CONSTANT","NAME":"w"}`, `{"INSTRUCTION":"MEMORY","NAME":"w","MEMORY":true}`), 3, "non-numeric MEMORY"},
		{"missing memory", lines(start, `{"INSTRUCTION":"CONSTANT","NAME":"w"}`, `{"INSTRUCTION":"MEMORY","NAME":"w"}`), 3, "missing field MEMORY"},
		{"memory for unknown name", with(`{"INSTRUCTION":"MEMORY","NAME":"zz","MEMORY":"8"}`), 4, `MEMORY for unknown name "zz"`},
		{"memory for the wrong name", lines(start, `{"INSTRUCTION":"CONSTANT","NAME":"w"}`, `{"INSTRUCTION":"MEMORY","NAME":"v","MEMORY":"8"}`), 3, `MEMORY for unknown name "v"`},
		{"constant without memory", lines(start, `{"INSTRUCTION":"CONSTANT","NAME":"w"}`, `{"INSTRUCTION":"RELEASE","NAME":"w"}`), 3, "expected MEMORY for CONSTANT w"},
		{"constant at end", lines(start, `{"INSTRUCTION":"CONSTANT","NAME":"w"}`), 0, "CONSTANT w at line 2 has no MEMORY line"},
		{"result count mismatch at end", with(
			`{"INSTRUCTION":"CALL","NAME":"f","ARGS":["w"],"RESULT":["x","y"],"TIME":"1"}`,
			`{"INSTRUCTION":"MEMORY","NAME":"x","MEMORY":"8"}`,
			`{"INSTRUCTION":"ALIAS","NAME":"x","ALIAS":"-1"}`), 0, "result count mismatch: CALL f at line 4 declares 2 results but only 1 MEMORY/ALIAS pairs follow"},
		{"result count mismatch mid-trace", with(
			`{"INSTRUCTION":"CALL","NAME":"f","ARGS":["w"],"RESULT":["x","y"],"TIME":"1"}`,
			`{"INSTRUCTION":"MEMORY","NAME":"x","MEMORY":"8"}`,
			`{"INSTRUCTION":"ALIAS","NAME":"x","ALIAS":"-1"}`,
			`{"INSTRUCTION":"RELEASE","NAME":"w"}`), 7, "result count mismatch"},
		{"alias before memory", with(
			`{"INSTRUCTION":"CALL","NAME":"f","ARGS":["w"],"RESULT":["x"],"TIME":"1"}`,
			`{"INSTRUCTION":"ALIAS","NAME":"x","ALIAS":"-1"}`), 5, `expected MEMORY for result "x"`},
		{"alias out of range", with(
			`{"INSTRUCTION":"CALL","NAME":"f","ARGS":["w"],"RESULT":["x"],"TIME":"1"}`,
			`{"INSTRUCTION":"MEMORY","NAME":"x","MEMORY":"8"}`,
			`{"INSTRUCTION":"ALIAS","NAME":"x","ALIAS":"1"}`), 6, "ALIAS 1 for x out of range"},
		{"non-numeric alias", with(
			`{"INSTRUCTION":"CALL","NAME":"f","ARGS":["w"],"RESULT":["x"],"TIME":"1"}`,
			`{"INSTRUCTION":"MEMORY","NAME":"x","MEMORY":"8"}`,
			`{"INSTRUCTION":"ALIAS","NAME":"x","ALIAS":"no"}`), 6, `non-numeric ALIAS "no"`},
		{"unknown argument", with(`{"INSTRUCTION":"CALL","NAME":"f","ARGS":["q"],"RESULT":[],"TIME":"1"}`), 4, `CALL f argument 0 names unknown tensor "q"`},
		{"duplicate result", with(`{"INSTRUCTION":"CALL","NAME":"f","ARGS":[],"RESULT":["x","x"],"TIME":"1"}`), 4, `result "x" listed twice`},
		{"result already defined", with(`{"INSTRUCTION":"CALL","NAME":"f","ARGS":[],"RESULT":["w"],"TIME":"1"}`), 4, `result "w" is already defined`},
		{"copy of unknown", with(`{"INSTRUCTION":"COPY","DST":"a","SRC":"q"}`), 4, `COPY SRC names unknown tensor "q"`},
		{"copy onto existing", with(`{"INSTRUCTION":"COPY","DST":"w","SRC":"w"}`), 4, `COPY DST "w" is already defined`},
		{"copy missing dst", with(`{"INSTRUCTION":"COPY","SRC":"w"}`), 4, "missing field DST"},
		{"copy_from unknown dst", with(`{"INSTRUCTION":"COPY_FROM","DST":"q","SRC":"w"}`), 4, `COPY_FROM DST names unknown tensor "q"`},
		{"mutate index out of range", with(`{"INSTRUCTION":"MUTATE","NAME":"m","ARGS":["w"],"MUTATE":[1],"TIME":"1"}`), 4, "index 1 out of range"},
		{"mutate missing list", with(`{"INSTRUCTION":"MUTATE","NAME":"m","ARGS":["w"],"TIME":"1"}`), 4, "missing field MUTATE"},
		{"over-release", with(`{"INSTRUCTION":"RELEASE","NAME":"w"}`, `{"INSTRUCTION":"RELEASE","NAME":"w"}`), 5, "no references left"},
		{"use after release", with(`{"INSTRUCTION":"RELEASE","NAME":"w"}`, `{"INSTRUCTION":"CALL","NAME":"f","ARGS":["w"],"RESULT":[],"TIME":"1"}`), 5, "after its last reference was released"},
		{"unknown annotation", with(`{"INSTRUCTION":"ANNOTATE","ANNOTATION":"LUNCH"}`), 4, `unknown annotation "LUNCH"`},
		{"no start", lines(constW...), 0, "no START annotation"},
		{"bad JSON before start", lines(`{oops`, start), 1, "bad JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.src)
			require.Error(t, err)
			var pe *ParseError
			require.True(t, errors.As(err, &pe), "want *ParseError, got %T: %v", err, err)
			assert.Equal(t, tc.line, pe.Line, "line of %v", err)
			assert.Contains(t, pe.Reason, tc.reason)
			if tc.line > 0 {
				assert.Contains(t, err.Error(), "line "+itoa(tc.line)+":")
			}
		})
	}
}

func itoa(n int) string {
	s := ""
	for {
		s = string(rune('0'+n%10)) + s
		n /= 10
		if n == 0 {
			return s
		}
	}
}

func TestParseNoStartOption(t *testing.T) {
	tr, err := ReadTrace(strings.NewReader(lines(`{"INSTRUCTION":"CONSTANT","NAME":"w"}`, `{"INSTRUCTION":"MEMORY","NAME":"w","MEMORY":8}`)), ParseOptions{NoStart: true})
	require.NoError(t, err)
	require.Equal(t, 1, tr.Len())
	assert.Equal(t, []int32{0}, tr.Outputs)
}

func TestParseLineTooLong(t *testing.T) {
	_, err := ReadTrace(strings.NewReader(start+"\n"+strings.Repeat(" ", 100)+"\n"), ParseOptions{MaxLineBytes: 64})
	var pe *ParseError
	require.True(t, errors.As(err, &pe))
	assert.Equal(t, 2, pe.Line)
	assert.Contains(t, pe.Reason, "longer than 64 bytes")
}

func TestParseStreamStopsOnCallbackError(t *testing.T) {
	src := lines(start, `{"INSTRUCTION":"CONSTANT","NAME":"w"}`, `{"INSTRUCTION":"MEMORY","NAME":"w","MEMORY":"8"}`, `{"INSTRUCTION":"RELEASE","NAME":"w"}`)
	stop := errors.New("enough")
	n := 0
	_, _, err := Parse(strings.NewReader(src), ParseOptions{}, func(Instr) error { n++; return stop })
	require.ErrorIs(t, err, stop)
	assert.Contains(t, err.Error(), "line 2", "the CONSTANT's line")
	assert.Equal(t, 1, n)
}

// TestParseSharedTraces parses the five real traces.
func TestParseSharedTraces(t *testing.T) {
	want := map[string]struct{ instrs, tensors, outputs int }{
		"lstm":           {32385, 8319, 12},
		"resnet32":       {2607, 696, 283},
		"transformer":    {12236, 3457, 512},
		"tv_densenet121": {12924, 3652, 1091},
		"unet":           {1829, 512, 202},
	}
	for _, tc := range sharedtraces.ForTest(t) {
		t.Run(tc.Name, func(t *testing.T) {
			f, err := os.Open(tc.Path)
			require.NoError(t, err)
			defer f.Close()
			tr, err := ReadTrace(f, ParseOptions{})
			require.NoError(t, err)
			w := want[tc.Name]
			assert.Equal(t, w.instrs, tr.Len())
			assert.Equal(t, w.tensors, tr.NumTensors())
			assert.Equal(t, w.outputs, len(tr.Outputs))
			assert.Equal(t, 1, tr.StartLine)
		})
	}
}

// FuzzParse feeds arbitrary bytes to the parser: it must never panic, and a
// trace it accepts must be internally consistent.
func FuzzParse(f *testing.F) {
	f.Add([]byte(lines(start, `{"INSTRUCTION":"CONSTANT","NAME":"w"}`, `{"INSTRUCTION":"MEMORY","NAME":"w","MEMORY":"8"}`,
		`{"INSTRUCTION":"CALL","NAME":"f","ARGS":["w","w"],"RESULT":["x","y"],"TIME":"3"}`,
		`{"INSTRUCTION":"MEMORY","NAME":"x","MEMORY":"4"}`, `{"INSTRUCTION":"ALIAS","NAME":"x","ALIAS":"-1"}`,
		`{"INSTRUCTION":"MEMORY","NAME":"y","MEMORY":"4"}`, `{"INSTRUCTION":"ALIAS","NAME":"y","ALIAS":"1"}`,
		`{"INSTRUCTION":"MUTATE","NAME":"m","ARGS":["x","y"],"MUTATE":[1,0],"TIME":"2"}`,
		`{"INSTRUCTION":"COPY","DST":"z","SRC":"x"}`, `{"INSTRUCTION":"COPY_FROM","DST":"z","SRC":"w"}`,
		`{"INSTRUCTION":"RELEASE","NAME":"x"}`, `{"INSTRUCTION":"ANNOTATE","ANNOTATION":"BACKWARD"}`)))
	f.Add([]byte(start + "\n{\"INSTRUCTION\":\"MEMORY\"}\n"))
	f.Add([]byte("\n\n" + start))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := ReadTrace(strings.NewReader(string(data)), ParseOptions{})
		if err != nil {
			var pe *ParseError
			if errors.As(err, &pe) && pe.Reason == "" {
				t.Fatalf("parse error without a reason: %v", err)
			}
			return
		}
		n := int32(tr.NumTensors())
		valid := func(x int32) bool { return x >= 0 && x < n }
		for _, in := range tr.All() {
			switch in.Kind {
			case KindConstant, KindCopy, KindRelease:
				require.True(t, valid(in.T))
			case KindCopyFrom:
				require.True(t, valid(in.T) && valid(in.Old))
			case KindCall, KindMutate:
				for _, a := range in.Args {
					require.True(t, valid(a))
				}
				for _, o := range in.Outs {
					require.True(t, valid(o.T))
					require.True(t, o.Alias >= -1 && int(o.Alias) < len(in.Args))
					if o.Alias >= 0 {
						require.Zero(t, o.Size)
					}
				}
				if in.Kind == KindMutate {
					require.Len(t, in.Mutated, len(in.Outs))
				}
			}
		}
		for _, o := range tr.Outputs {
			require.True(t, valid(o))
		}
	})
}
