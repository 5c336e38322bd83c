package allocbench

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReadEvents(t *testing.T) {
	const trace = `{"INSTRUCTION":"CONSTANT","NAME":"ignored"}
{"INSTRUCTION":"MEMORY","MEMORY":"999","NAME":"ignored"}
{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}
{"INSTRUCTION":"CONSTANT","NAME":"w"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"w"}
{"INSTRUCTION":"CONSTANT","NAME":"z"}
{"INSTRUCTION":"MEMORY","MEMORY":"0","NAME":"z"}
{"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"op","RESULT":["a","v"],"TIME":"10"}
{"INSTRUCTION":"MEMORY","MEMORY":"200","NAME":"a"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"a"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"v"}
{"ALIAS":"0","INSTRUCTION":"ALIAS","NAME":"v"}
{"DST":"a2","INSTRUCTION":"COPY","SRC":"a"}
{"ARGS":["a"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"relu_","TIME":"5"}
{"INSTRUCTION":"RELEASE","NAME":"a"}
{"INSTRUCTION":"RELEASE","NAME":"w"}
{"INSTRUCTION":"RELEASE","NAME":"unknown"}
{"DST":"v","INSTRUCTION":"COPY_FROM","SRC":"a2"}
{"INSTRUCTION":"RELEASE","NAME":"a2"}
{"INSTRUCTION":"RELEASE","NAME":"v"}
{"ANNOTATION":"BACKWARD","INSTRUCTION":"ANNOTATE"}
`
	tr, err := Read(strings.NewReader(trace))
	require.NoError(t, err)
	// w (0) and a (1) are allocated; z has 0 bytes; v aliases w. w's storage
	// lives until v drops it (COPY_FROM), a's until its last name (v) goes.
	require.Equal(t, []Event{
		{ID: 0, Size: 100},
		{ID: 1, Size: 200},
		{Free: true, ID: 0},
		{Free: true, ID: 1},
	}, tr.Events)
	require.Equal(t, 2, tr.Storages)
	require.Equal(t, 1, tr.Live, "z is still referenced")
}

func TestReadErrors(t *testing.T) {
	tests := []struct {
		name, trace, msg string
	}{
		{"bad json", `{"INSTRUCTION":`, "line 1"},
		{"unknown instruction", `{"INSTRUCTION":"JUMP"}`, `unknown instruction "JUMP"`},
		{"memory outside a call", `{"INSTRUCTION":"MEMORY","MEMORY":"1","NAME":"x"}`, "outside a CALL"},
		{"bad size", `{"INSTRUCTION":"CONSTANT","NAME":"x"}
{"INSTRUCTION":"MEMORY","MEMORY":"lots","NAME":"x"}`, `bad size "lots"`},
		{"alias of a missing argument", `{"ARGS":[],"INSTRUCTION":"CALL","NAME":"op","RESULT":["a"]}
{"INSTRUCTION":"MEMORY","MEMORY":"8","NAME":"a"}
{"ALIAS":"2","INSTRUCTION":"ALIAS","NAME":"a"}`, "argument 2 of CALL op"},
		{"copy of a dead name", `{"DST":"b","INSTRUCTION":"COPY","SRC":"a"}`, "source is not live"},
		{"truncated call", `{"ARGS":[],"INSTRUCTION":"CALL","NAME":"op","RESULT":["a"]}`, "ends inside the results"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(tc.trace))
			require.ErrorContains(t, err, tc.msg)
		})
	}
}
