package torchsnap

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/bench/workload"
)

// render prints a workload as handmade.expected does.
func render(w *workload.Workload) string {
	var b strings.Builder
	for _, op := range w.Ops {
		if op.Free {
			fmt.Fprintf(&b, "free %d\n", op.ID)
		} else {
			fmt.Fprintf(&b, "alloc %d %d %d\n", op.ID, op.Stream, op.Size)
		}
	}
	return b.String()
}

func TestHandmadeProtocols(t *testing.T) {
	want, err := os.ReadFile("testdata/handmade.expected")
	require.NoError(t, err)
	for _, proto := range []int{2, 4, 5} {
		t.Run(fmt.Sprintf("protocol %d", proto), func(t *testing.T) {
			path := fmt.Sprintf("testdata/handmade-p%d.pickle", proto)
			s, err := ReadFile(path)
			require.NoError(t, err)
			require.Len(t, s.Traces, 2)
			assert.Len(t, s.Traces[0], 13)
			require.Len(t, s.Segments, 2)
			assert.Equal(t, int64(0x55D000001000), s.Segments[0].Stream)
			assert.Equal(t, uint64(20<<20), s.Segments[0].TotalSize)
			assert.Equal(t, "inactive", s.Segments[0].Blocks[2].State)
			assert.Equal(t, uint64(1<<40), s.Traces[0][9].Size, "the oom entry")

			w, err := s.Workload("handmade", path, Options{Device: -1})
			require.NoError(t, err)
			assert.Equal(t, string(want), render(w))
			assert.Equal(t, 2, w.Streams)
			assert.Equal(t, 6, w.Allocs)
			require.NoError(t, w.Validate())
			assert.Len(t, w.Notes, 2, "pre-window free and end-state block are noted: %v", w.Notes)

			// Device 1 by number.
			w1, err := s.Workload("d1", path, Options{Device: 1})
			require.NoError(t, err)
			assert.Equal(t, "alloc 0 0 10\nfree 0\n", render(w1))
			_, err = s.Workload("d7", path, Options{Device: 7})
			assert.ErrorContains(t, err, "traces for 2 device(s)")
		})
	}
}

// TestRealRecording reads a pickle recorded by the installed torch (its
// profiler's allocation events, through memscale.record_snapshot) and the
// samples shipped in samples/snapshots.
func TestRealRecording(t *testing.T) {
	for _, path := range []string{"testdata/cpu-run.pickle", "../../samples/snapshots/mlp-train.pickle", "../../samples/snapshots/gpt2-train.pickle"} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			s, err := ReadFile(path)
			require.NoError(t, err)
			w, err := s.Workload("x", path, Options{Device: -1})
			require.NoError(t, err)
			require.NoError(t, w.Validate())
			assert.Greater(t, w.Allocs, 20)
			assert.Greater(t, w.PeakRequested(), uint64(0))
			assert.Equal(t, 1, w.Streams)
		})
	}
}

func TestTruncated(t *testing.T) {
	data, err := os.ReadFile("testdata/handmade-p4.pickle")
	require.NoError(t, err)
	for _, n := range []int{1, 2, 20, len(data) / 2, len(data) - 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			_, err := Read(bytes.NewReader(data[:n]))
			require.Error(t, err)
			assert.Contains(t, err.Error(), "truncated pickle")
			assert.Contains(t, err.Error(), "_dump_snapshot")
		})
	}
	// Through ReadFile the error names the file.
	p := filepath.Join(t.TempDir(), "cut.pickle")
	require.NoError(t, os.WriteFile(p, data[:len(data)/2], 0o644))
	_, err = ReadFile(p)
	assert.ErrorContains(t, err, p)
	assert.ErrorContains(t, err, "truncated pickle")
}

func TestBadInputs(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "empty file"},
		{"not a pickle", []byte("Thread,Time,Action\n"), "not a pickle protocol marker"},
		{"corrupt opcode", []byte{0x80, 0x04, 0xff, 0xff, 0xff}, "corrupt pickle near byte"},
		{"a list, not a dict", []byte("\x80\x04]\x94."), "not a dict with 'segments' and 'device_traces'"},
		{"dict without traces", []byte("\x80\x04}\x94\x8c\x08segments\x94]\x94s."), "no 'device_traces' (keys: segments)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(tc.data))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestNoHistory(t *testing.T) {
	s := &Snapshot{Traces: [][]Entry{{{Action: "segment_alloc"}}}}
	_, err := s.Workload("x", "x", Options{Device: -1})
	assert.ErrorContains(t, err, "_record_memory_history")
}

func FuzzRead(f *testing.F) {
	for _, p := range []string{"testdata/handmade-p2.pickle", "testdata/handmade-p5.pickle", "testdata/cpu-run.pickle"} {
		data, err := os.ReadFile(p)
		require.NoError(f, err)
		f.Add(data)
	}
	f.Add([]byte{0x80, 0x04, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Read(bytes.NewReader(data))
		if err != nil {
			return
		}
		w, err := s.Workload("fuzz", "fuzz", Options{Device: -1})
		if err != nil {
			return
		}
		if err := w.Validate(); err != nil {
			t.Fatalf("a workload the reader accepted is invalid: %v", err)
		}
	})
}
