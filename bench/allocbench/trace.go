// Package allocbench replays the storage allocations and frees of DTR
// training traces (../shared/traces/dtr) through the allocator and measures
// its peak memory, fragmentation and speed.
//
// The trace reader here is deliberately minimal and independent of the
// recompute package: it derives only when storage is allocated and freed.
//
//   - CONSTANT NAME, then MEMORY NAME bytes: a new storage referenced by NAME.
//   - CALL ... RESULT [names]: for each result a MEMORY line and an ALIAS
//     line follow. ALIAS -1: a new storage of MEMORY bytes; ALIAS k >= 0: the
//     result shares the storage of argument k (no memory).
//   - MUTATE: in place, no new memory.
//   - COPY DST SRC: DST is one more reference to SRC's storage.
//   - COPY_FROM DST SRC: DST drops its old reference and refers to SRC's
//     storage.
//   - RELEASE NAME: NAME's reference is dropped (unknown names are ignored).
//
// A storage is freed when its last reference (through any name, alias or
// copy) is gone. Storages of 0 bytes allocate nothing, as in PyTorch.
package allocbench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
)

// Event is one allocation or free of a storage.
type Event struct {
	// Free is false for an allocation, true for a free.
	Free bool
	// ID identifies the storage (dense, from 0).
	ID int
	// Size is the storage's size in bytes (allocations only).
	Size uint64
}

// Trace is the allocation events of one trace.
type Trace struct {
	Events []Event
	// Storages is the number of storages allocated (IDs are < Storages).
	Storages int
	// Live is the number of storages still referenced at the end.
	Live int
	// Instructions is the number of trace lines replayed.
	Instructions int
}

type instruction struct {
	Instruction string   `json:"INSTRUCTION"`
	Name        string   `json:"NAME"`
	Memory      string   `json:"MEMORY"`
	Alias       string   `json:"ALIAS"`
	Args        []string `json:"ARGS"`
	Result      []string `json:"RESULT"`
	Dst         string   `json:"DST"`
	Src         string   `json:"SRC"`
	Annotation  string   `json:"ANNOTATION"`
}

type storage struct {
	id   int
	refs int
}

// reader turns trace instructions into events.
type reader struct {
	tr      Trace
	names   map[string]*storage
	started bool
	// The CALL whose results are being read, and the next result's index and
	// size.
	call     *instruction
	next     int
	size     uint64
	haveSize bool
}

// ReadFile reads the allocation events of the trace at path.
func ReadFile(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("allocbench: %w", err)
	}
	defer f.Close()
	tr, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("allocbench: %s: %w", path, err)
	}
	return tr, nil
}

// Read reads the allocation events of a trace from r, one JSON object per
// line, replaying from the START annotation (or the first line when there is
// none).
func Read(r io.Reader) (*Trace, error) {
	rd := &reader{names: make(map[string]*storage)}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 16<<20)
	var lines []instruction // instructions before START, in case there is none
	line := 0
	for sc.Scan() {
		line++
		var in instruction
		if err := json.Unmarshal(sc.Bytes(), &in); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if !rd.started {
			if in.Instruction == "ANNOTATE" && in.Annotation == "START" {
				rd.started = true
				lines = nil
				continue
			}
			lines = append(lines, in)
			continue
		}
		if err := rd.step(&in); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	if !rd.started {
		for i := range lines {
			if err := rd.step(&lines[i]); err != nil {
				return nil, fmt.Errorf("instruction %d: %w", i+1, err)
			}
		}
	}
	if rd.call != nil {
		return nil, fmt.Errorf("trace ends inside the results of CALL %s", rd.call.Name)
	}
	seen := map[*storage]bool{}
	for _, s := range rd.names {
		seen[s] = true
	}
	rd.tr.Live = len(seen)
	return &rd.tr, nil
}

func (rd *reader) step(in *instruction) error {
	rd.tr.Instructions++
	if rd.call != nil && in.Instruction != "MEMORY" && in.Instruction != "ALIAS" {
		return fmt.Errorf("%s inside the results of CALL %s (result %d of %d)", in.Instruction, rd.call.Name, rd.next, len(rd.call.Result))
	}
	switch in.Instruction {
	case "ANNOTATE", "MUTATE":
		// No memory is allocated or freed.
	case "CONSTANT":
		rd.call = &instruction{Name: "CONSTANT", Result: []string{in.Name}}
		rd.next = 0
	case "CALL":
		if len(in.Result) > 0 {
			c := *in
			rd.call = &c
			rd.next = 0
		}
	case "MEMORY":
		if rd.call == nil {
			return fmt.Errorf("MEMORY %s outside a CALL or CONSTANT", in.Name)
		}
		n, err := strconv.ParseUint(in.Memory, 10, 64)
		if err != nil {
			return fmt.Errorf("MEMORY %s: bad size %q: %w", in.Name, in.Memory, err)
		}
		rd.size, rd.haveSize = n, true
		if rd.call.Name == "CONSTANT" {
			rd.bind(in.Name, rd.alloc(n))
			rd.call, rd.haveSize = nil, false
		}
	case "ALIAS":
		if rd.call == nil || !rd.haveSize {
			return fmt.Errorf("ALIAS %s without a preceding MEMORY of a CALL result", in.Name)
		}
		k, err := strconv.Atoi(in.Alias)
		if err != nil {
			return fmt.Errorf("ALIAS %s: bad index %q: %w", in.Name, in.Alias, err)
		}
		var s *storage
		if k < 0 {
			s = rd.alloc(rd.size)
		} else {
			if k >= len(rd.call.Args) {
				return fmt.Errorf("ALIAS %s: argument %d of CALL %s, which has %d", in.Name, k, rd.call.Name, len(rd.call.Args))
			}
			if s = rd.names[rd.call.Args[k]]; s == nil {
				return fmt.Errorf("ALIAS %s: argument %q of CALL %s is not live", in.Name, rd.call.Args[k], rd.call.Name)
			}
		}
		rd.bind(in.Name, s)
		rd.haveSize = false
		rd.next++
		if rd.next == len(rd.call.Result) {
			rd.call = nil
		}
	case "COPY":
		s := rd.names[in.Src]
		if s == nil {
			return fmt.Errorf("COPY %s %s: source is not live", in.Dst, in.Src)
		}
		rd.bind(in.Dst, s)
	case "COPY_FROM":
		s := rd.names[in.Src]
		if s == nil {
			return fmt.Errorf("COPY_FROM %s %s: source is not live", in.Dst, in.Src)
		}
		rd.bind(in.Dst, s)
	case "RELEASE":
		rd.drop(in.Name)
	default:
		return fmt.Errorf("unknown instruction %q", in.Instruction)
	}
	return nil
}

// alloc creates a storage of n bytes.
func (rd *reader) alloc(n uint64) *storage {
	s := &storage{id: -1}
	if n > 0 {
		s.id = rd.tr.Storages
		rd.tr.Storages++
		rd.tr.Events = append(rd.tr.Events, Event{ID: s.id, Size: n})
	}
	return s
}

// bind makes name one more reference to s (dropping what it named before).
func (rd *reader) bind(name string, s *storage) {
	s.refs++
	rd.drop(name)
	rd.names[name] = s
}

// drop removes name's reference, freeing its storage with the last one.
func (rd *reader) drop(name string) {
	s := rd.names[name]
	if s == nil {
		return
	}
	delete(rd.names, name)
	s.refs--
	if s.refs == 0 && s.id >= 0 {
		rd.tr.Events = append(rd.tr.Events, Event{Free: true, ID: s.id})
	}
}
