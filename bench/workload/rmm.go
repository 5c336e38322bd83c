package workload

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// rmmColumns are the columns of RMM's logging_resource_adaptor CSV that the
// replay needs (Thread and Time are read if present but not needed).
var rmmColumns = []string{"Action", "Pointer", "Size"}

// ReadRMM reads an RMM replay log: the CSV that rmm's
// logging_resource_adaptor writes (header Thread,Time,Action,Pointer,Size,Stream;
// Action allocate, deallocate or free, "allocate failure"). Operations are
// replayed in file order; failed allocations are skipped (and counted in a
// note). Errors name the file, the line and what was expected.
func ReadRMM(path, name string) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	defer f.Close()
	w, err := ParseRMM(f, name, path)
	if err != nil {
		return nil, fmt.Errorf("workload: %s: %w", path, err)
	}
	return w, nil
}

// ParseRMM parses an RMM replay log from r.
func ParseRMM(r io.Reader, name, path string) (*Workload, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty file: an RMM log starts with the header Thread,Time,Action,Pointer,Size,Stream")
		}
		return nil, fmt.Errorf("line 1: %w", err)
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.TrimSpace(h)] = i
	}
	for _, c := range rmmColumns {
		if _, ok := col[c]; !ok {
			return nil, fmt.Errorf("line 1: header %q has no %s column (an RMM log starts with Thread,Time,Action,Pointer,Size,Stream)", strings.Join(header, ","), c)
		}
	}
	streamCol, hasStream := col["Stream"]
	b := NewBuilder(name, path, "rmm-log")
	failed, unknownFrees := 0, 0
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// A *csv.ParseError names the line and column itself.
			return nil, fmt.Errorf("malformed CSV: %w", err)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue
		}
		field := func(c string) (string, error) {
			i := col[c]
			if i >= len(rec) {
				return "", fmt.Errorf("line %d: %d fields, no %s column (want %d fields like the header)", line, len(rec), c, len(header))
			}
			return strings.TrimSpace(rec[i]), nil
		}
		action, err := field("Action")
		if err != nil {
			return nil, err
		}
		ptrS, err := field("Pointer")
		if err != nil {
			return nil, err
		}
		ptr, err := parseHex(ptrS)
		if err != nil {
			return nil, fmt.Errorf("line %d: Pointer %q: %v (want a hexadecimal address such as 0x7f8a40000000)", line, ptrS, err)
		}
		sizeS, err := field("Size")
		if err != nil {
			return nil, err
		}
		size, err := strconv.ParseUint(sizeS, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: Size %q is not a byte count (want a decimal integer)", line, sizeS)
		}
		var stream int64
		if hasStream && streamCol < len(rec) {
			s, err := parseHex(strings.TrimSpace(rec[streamCol]))
			if err != nil {
				return nil, fmt.Errorf("line %d: Stream %q: %v (want a hexadecimal handle such as 0x0)", line, rec[streamCol], err)
			}
			stream = int64(s)
		}
		switch strings.ToLower(action) {
		case "allocate":
			if err := b.Alloc(ptr, size, stream); err != nil {
				return nil, fmt.Errorf("line %d: allocate at 0x%x: %w", line, ptr, err)
			}
		case "deallocate", "free":
			if !b.Free(ptr) {
				unknownFrees++
			}
		case "allocate failure", "allocate_failure":
			failed++
		default:
			return nil, fmt.Errorf("line %d: unknown Action %q (want allocate, deallocate, free or allocate failure)", line, action)
		}
	}
	if failed > 0 {
		b.Note("%d failed allocations in the log skipped", failed)
	}
	if unknownFrees > 0 {
		b.Note("%d frees of pointers not allocated in the log skipped", unknownFrees)
	}
	w := b.Finish()
	if len(w.Ops) == 0 {
		return nil, errors.New("no allocations in the log")
	}
	return w, nil
}

// parseHex parses 0x-prefixed (or bare) hexadecimal, or a decimal number
// when it has no prefix and only digits.
func parseHex(s string) (uint64, error) {
	t := strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	if t == "" {
		return 0, errors.New("empty")
	}
	if t == s {
		if v, err := strconv.ParseUint(s, 10, 64); err == nil {
			return v, nil
		}
	}
	v, err := strconv.ParseUint(t, 16, 64)
	if err != nil {
		return 0, errors.New("not a hexadecimal number")
	}
	return v, nil
}

// WriteRMM writes w as an RMM replay log (Thread,Time,Action,Pointer,Size,
// Stream): one thread, time = the operation's index in microseconds, the
// pointer a synthetic address per allocation ID (0x1000 apart), the stream
// its index. RMM's REPLAY_BENCHMARK and bench/gpu/bench_replay.py replay it.
func WriteRMM(out io.Writer, w *Workload) error {
	cw := csv.NewWriter(out)
	if err := cw.Write([]string{"Thread", "Time", "Action", "Pointer", "Size", "Stream"}); err != nil {
		return err
	}
	for i, op := range w.Ops {
		action := "allocate"
		if op.Free {
			action = "free"
		}
		if err := cw.Write([]string{"1", strconv.Itoa(i), action, fmt.Sprintf("0x%x", 0x10000000+uint64(op.ID)*0x1000),
			strconv.FormatUint(op.Size, 10), fmt.Sprintf("0x%x", op.Stream)}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
