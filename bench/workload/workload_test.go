package workload

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const rmmLog = `Thread,Time,Action,Pointer,Size,Stream
140573312345856,1634567890.123456,allocate,0x7f8a40000000,1024,0x0
140573312345856,1634567890.234567,allocate,0x7f8a40000400,2048,0x7f8a38001020
140573312345856,1634567890.300000,allocate failure,0x0,99999999999,0x0
140573312345856,1634567890.345678,deallocate,0x7f8a40000000,1024,0x0
140573312345856,1634567890.345679,free,0x7f8a40000400,2048,0x7f8a38001020
140573312345856,1634567890.345680,free,0x7f8a4000ffff,16,0x0
140573312345856,1634567890.445678,allocate,0x7f8a40000000,4096,0x0
`

func TestParseRMM(t *testing.T) {
	w, err := ParseRMM(strings.NewReader(rmmLog), "log", "log.csv")
	require.NoError(t, err)
	require.NoError(t, w.Validate())
	assert.Equal(t, []Op{
		{ID: 0, Stream: 0, Size: 1024},
		{ID: 1, Stream: 1, Size: 2048},
		{Free: true, ID: 0, Stream: 0, Size: 1024},
		{Free: true, ID: 1, Stream: 1, Size: 2048},
		{ID: 2, Stream: 0, Size: 4096},
	}, w.Ops)
	assert.Equal(t, 2, w.Streams)
	assert.Equal(t, 3, w.Allocs)
	assert.Equal(t, uint64(4096), w.PeakRequested())
	assert.Len(t, w.Notes, 2) // one failed allocation, one unknown free
}

func TestParseRMMErrors(t *testing.T) {
	hdr := "Thread,Time,Action,Pointer,Size,Stream\n"
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", "empty file"},
		{"no Action column", "Thread,Time,Pointer,Size\n1,2,0x0,4\n", "no Action column"},
		{"bad size", hdr + "1,2,allocate,0x10,12x,0x0\n", "line 2: Size \"12x\""},
		{"bad pointer", hdr + "1,2,allocate,0xZZ,12,0x0\n", "line 2: Pointer \"0xZZ\""},
		{"bad action", hdr + "1,2,alloc,0x10,12,0x0\n", "line 2: unknown Action \"alloc\""},
		{"short line", hdr + "1,2,allocate\n", "line 2: 3 fields, no Pointer column"},
		{"double allocation", hdr + "1,2,allocate,0x10,12,0x0\n1,2,allocate,0x10,12,0x0\n", "line 3: allocate at 0x10"},
		{"quote", hdr + "1,2,\"allocate,0x10,12,0x0\n", "malformed CSV: parse error on line 2"},
		{"nothing allocated", hdr, "no allocations"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRMM(strings.NewReader(tc.in), "x", "x.csv")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	p := filepath.Join(t.TempDir(), "bad.csv")
	require.NoError(t, os.WriteFile(p, []byte(hdr+"1,2,allocate,0x10,x,0x0\n"), 0o644))
	_, err := ReadRMM(p, "bad")
	assert.ErrorContains(t, err, p+": line 2")
}

func TestReadDTR(t *testing.T) {
	trace := `{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}
{"INSTRUCTION":"CONSTANT","NAME":"x"}
{"INSTRUCTION":"MEMORY","NAME":"x","MEMORY":"4096"}
{"INSTRUCTION":"CALL","NAME":"relu","ARGS":["x"],"RESULT":["y"],"TIME":"10"}
{"INSTRUCTION":"MEMORY","NAME":"y","MEMORY":"4096"}
{"INSTRUCTION":"ALIAS","NAME":"y","ALIAS":"-1"}
{"INSTRUCTION":"RELEASE","NAME":"x"}
`
	p := filepath.Join(t.TempDir(), "t.log")
	require.NoError(t, os.WriteFile(p, []byte(trace), 0o644))
	w, err := ReadDTR(p, "t")
	require.NoError(t, err)
	assert.Equal(t, []Op{{ID: 0, Size: 4096}, {ID: 1, Size: 4096}, {Free: true, ID: 0, Size: 4096}}, w.Ops)
	assert.Equal(t, uint64(8192), w.PeakRequested())

	require.NoError(t, os.WriteFile(p, []byte(trace+"{bad\n"), 0o644))
	_, err = ReadDTR(p, "t")
	assert.ErrorContains(t, err, "line 8")
}

func TestValidate(t *testing.T) {
	w := &Workload{Name: "w", Allocs: 1, Ops: []Op{{ID: 0}, {ID: 0}}}
	assert.ErrorContains(t, w.Validate(), "allocated twice")
	w.Ops = []Op{{Free: true, ID: 0}}
	assert.ErrorContains(t, w.Validate(), "not live")
	w.Ops = []Op{{ID: 3}}
	assert.ErrorContains(t, w.Validate(), "out of range")
}

func FuzzParseRMM(f *testing.F) {
	f.Add(rmmLog)
	f.Add("Thread,Time,Action,Pointer,Size,Stream\n1,2,allocate,0x10,12,0x0\n")
	f.Fuzz(func(t *testing.T, in string) {
		w, err := ParseRMM(strings.NewReader(in), "f", "f.csv")
		if err != nil {
			return
		}
		if err := w.Validate(); err != nil {
			t.Fatalf("accepted log gives an invalid workload: %v", err)
		}
	})
}

func TestWriteRMMRoundTrip(t *testing.T) {
	w, err := ParseRMM(strings.NewReader(rmmLog), "log", "log.csv")
	require.NoError(t, err)
	var b strings.Builder
	require.NoError(t, WriteRMM(&b, w))
	back, err := ParseRMM(strings.NewReader(b.String()), "log", "back.csv")
	require.NoError(t, err)
	assert.Equal(t, w.Ops, back.Ops)
	assert.Equal(t, w.Streams, back.Streams)
}
