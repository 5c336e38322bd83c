package workload

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"

	"github.com/memscale/memscale/bench/allocbench"
)

// ReadDTR reads the storage allocations and frees of a DTR trace (.log, or
// gzip-compressed) through allocbench's reader. Every storage is on stream 0.
func ReadDTR(path, name string) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	defer f.Close()
	var r io.Reader = bufio.NewReader(f)
	if br := r.(*bufio.Reader); isGzip(br) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("workload: %s: gzip: %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	tr, err := allocbench.Read(r)
	if err != nil {
		return nil, fmt.Errorf("workload: %s (DTR trace, one JSON object per line): %w", path, err)
	}
	return FromDTR(tr, name, path), nil
}

// FromDTR converts a parsed DTR trace.
func FromDTR(tr *allocbench.Trace, name, path string) *Workload {
	w := &Workload{Name: name, Path: path, Format: "dtr-trace", Allocs: tr.Storages, Streams: 1}
	sizes := make([]uint64, tr.Storages)
	w.Ops = make([]Op, len(tr.Events))
	for i, ev := range tr.Events {
		if !ev.Free {
			sizes[ev.ID] = ev.Size
		}
		w.Ops[i] = Op{Free: ev.Free, ID: int32(ev.ID), Size: sizes[ev.ID]}
	}
	return w
}

// isGzip reports whether br starts with the gzip magic bytes.
func isGzip(br *bufio.Reader) bool {
	b, err := br.Peek(2)
	return err == nil && b[0] == 0x1f && b[1] == 0x8b
}
