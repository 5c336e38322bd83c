package recompute

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// sameRaw reports whether two decoded lines hold the same fields.
func sameRaw(a, b *rawLine) bool {
	str := func(x, y *string) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	list := func(x, y *[]string) bool { return (x == nil) == (y == nil) && (x == nil || slices.Equal(*x, *y)) }
	return str(a.Instruction, b.Instruction) && str(a.Name, b.Name) && str(a.Dst, b.Dst) && str(a.Src, b.Src) &&
		str(a.Annotation, b.Annotation) && string(a.Memory) == string(b.Memory) && string(a.Time) == string(b.Time) &&
		string(a.Alias) == string(b.Alias) && list(a.Args, b.Args) && list(a.Result, b.Result) && a.Mutate == nil && b.Mutate == nil
}

// checkFast fails if decodeFast accepts a line that encoding/json decodes
// differently or refuses.
func checkFast(t *testing.T, line []byte) bool {
	var fast rawLine
	if !decodeFast(line, &fast) {
		return false
	}
	var slow rawLine
	require.NoError(t, json.Unmarshal(line, &slow), "decodeFast accepted %q", line)
	require.True(t, sameRaw(&fast, &slow), "%q: fast %+v, encoding/json %+v", line, fast, slow)
	return true
}

// TestDecodeFast checks the fast path against encoding/json on the lines the
// traces hold and on lines it must leave to encoding/json.
func TestDecodeFast(t *testing.T) {
	for _, l := range []string{
		`{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}`,
		`{"INSTRUCTION":"CONSTANT","NAME":"x81310"}`,
		`{"INSTRUCTION":"MEMORY","MEMORY":"10444800","NAME":"x81310"}`,
		`{"DST":"x81311","INSTRUCTION":"COPY","SRC":"x81310"}`,
		`{"ARGS":["x7973","x7691"],"INSTRUCTION":"CALL","NAME":"cudnn_convolution","RESULT":["x7977"],"TIME":"733881"}`,
		`{"ARGS":[],"INSTRUCTION":"CALL","NAME":"zeros","RESULT":[],"TIME":"9223372036854775807"}`,
		`{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x7977"}`,
		`{"NAME":"a","NAME":"b"}`,
		`{}`,
	} {
		require.True(t, checkFast(t, []byte(l)), "%s takes the fast path", l)
	}
	for _, l := range []string{
		`{"INSTRUCTION": "CALL"}`,
		`{"instruction":"CALL"}`,
		`{"NAME":"a\"b"}`,
		`{"MEMORY":10}`,
		`{"NAME":null}`,
		`{"NAME":"é"}`,
		`{"MUTATE":[0]}`,
		`{"ARGS":"x"}`,
		`{"ARGS":["a",]}`,
		`{"NAME":"a"}x`,
		`{"NAME":"a",}`,
		`{"OTHER":"a"}`,
		`{"ARGS":["a"`,
		`{`,
		`[]`,
	} {
		require.False(t, checkFast(t, []byte(l)), "%s is left to encoding/json", l)
	}
}

// FuzzDecodeFast checks that every line decodeFast accepts decodes the same
// with encoding/json.
func FuzzDecodeFast(f *testing.F) {
	f.Add([]byte(`{"ARGS":["x7973","x7691"],"INSTRUCTION":"CALL","NAME":"conv","RESULT":["x7977"],"TIME":"733881"}`))
	f.Add([]byte(`{"INSTRUCTION":"MEMORY","MEMORY":"9223372036854775807","NAME":"x"}`))
	f.Add([]byte(`{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x7977","NAME":"y"}`))
	f.Fuzz(func(t *testing.T, line []byte) { checkFast(t, line) })
}
