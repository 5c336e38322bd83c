package recompute

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// Kind is the kind of a lowered trace instruction.
type Kind uint8

// Instruction kinds. Every instruction of the DTR trace format maps to one of
// them; MEMORY and ALIAS lines are folded into the CONSTANT or CALL they belong
// to.
const (
	// KindConstant registers a pinned external tensor (a parameter or input).
	KindConstant Kind = iota + 1
	// KindCall runs an op that produces fresh or aliasing outputs.
	KindCall
	// KindMutate runs an in-place op: every mutated argument gets a new version.
	KindMutate
	// KindCopy adds a reference to an existing tensor under a new name.
	KindCopy
	// KindCopyFrom makes an existing name point at another tensor: the old
	// tensor loses a reference and the new one gains one.
	KindCopyFrom
	// KindRelease drops one reference to a tensor.
	KindRelease
	// KindAnnotate marks a point in the trace (BACKWARD).
	KindAnnotate
)

// String returns the trace-format name of the kind.
func (k Kind) String() string {
	switch k {
	case KindConstant:
		return "CONSTANT"
	case KindCall:
		return "CALL"
	case KindMutate:
		return "MUTATE"
	case KindCopy:
		return "COPY"
	case KindCopyFrom:
		return "COPY_FROM"
	case KindRelease:
		return "RELEASE"
	case KindAnnotate:
		return "ANNOTATE"
	case KindPin:
		return "PIN"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Annotations the parser understands.
const (
	AnnotationStart    = "START"
	AnnotationBackward = "BACKWARD"
)

// Out is one output of a CALL or MUTATE instruction.
type Out struct {
	// Size is the output's storage size in bytes (0 for an alias).
	Size uint64
	// T is the trace tensor number of the output.
	T int32
	// Alias is -1 for fresh storage, otherwise the argument index whose
	// storage the output shares.
	Alias int32
}

// Instr is one lowered trace instruction. Names are resolved to trace tensor
// numbers (0, 1, 2, ... in order of creation), so that a replay needs no name
// lookups: COPY becomes "one more reference to tensor T", MUTATE names the new
// versions it creates and the old versions that lose a reference.
type Instr struct {
	// Kind says which fields are set.
	Kind Kind
	// Line is the 1-based line number of the instruction in the trace.
	Line int
	// Op is the op name (CALL, MUTATE) or the annotation (ANNOTATE).
	Op string
	// T is the tensor of CONSTANT (new), COPY and COPY_FROM (gains a
	// reference) and RELEASE (loses one).
	T int32
	// Old is the tensor that loses a reference in COPY_FROM.
	Old int32
	// Size is the size in bytes of a CONSTANT.
	Size uint64
	// Args are the input tensors of CALL and MUTATE.
	Args []int32
	// Outs are the outputs of CALL and the new versions created by MUTATE.
	Outs []Out
	// Mutated lists, for MUTATE, the argument indices that were mutated,
	// parallel to Outs; the old versions Args[Mutated[i]] lose a reference.
	Mutated []int32
	// Time is the measured cost of CALL and MUTATE in nanoseconds.
	Time int64
}

// Trace is a whole parsed trace, ready to replay. Its instructions, from
// the START annotation on, are packed (packed.go): Len, At, All and Append
// read and add them.
type Trace struct {
	recs    []instrRec
	args    []int32
	outs    []Out
	muts    []int32
	ops     []string         // interned op names and annotations; ops[0] = ""
	opIndex map[string]int32 // ops' indices, for Append (nil until needed)
	// Names holds, for each trace tensor number, the name it was created
	// under (MUTATE versions get the argument's name with a "$" suffix).
	Names []string
	// Outputs are the tensors still referenced at the end of the trace, in
	// the order their names first appeared: they must be resident at the end.
	Outputs []int32
	// Lines is the number of lines read.
	Lines int
	// StartLine is the line of the START annotation (0 if none was required).
	StartLine int
	// IgnoredReleases counts RELEASE lines naming an unknown tensor.
	IgnoredReleases int
}

// NumTensors returns the number of distinct tensors the trace creates.
func (t *Trace) NumTensors() int { return len(t.Names) }

// ParseOptions controls Parse.
type ParseOptions struct {
	// NoStart replays from the first line instead of from the START
	// annotation. By default a trace without START is an error.
	NoStart bool
	// MaxLineBytes bounds the length of one line (default 16 MiB).
	MaxLineBytes int
}

// ParseError is a malformed trace line.
type ParseError struct {
	// Line is the 1-based line number (0 for a problem found at the end).
	Line int
	// Reason says what is wrong.
	Reason string
}

// Error implements error.
func (e *ParseError) Error() string {
	if e.Line == 0 {
		return "dtr trace: at end of input: " + e.Reason
	}
	return fmt.Sprintf("dtr trace: line %d: %s", e.Line, e.Reason)
}

// ReadTrace parses a whole trace from r.
func ReadTrace(r io.Reader, opt ParseOptions) (*Trace, error) {
	tr := &Trace{}
	p := newParser(opt)
	err := p.run(r, tr.Append)
	if err != nil {
		return nil, err
	}
	tr.compact()
	tr.Names = p.names
	tr.Outputs = p.outputs()
	tr.Lines = p.line
	tr.StartLine = p.startLine
	tr.IgnoredReleases = p.ignored
	return tr, nil
}

// Parse streams the instructions of a trace to fn as they are read, checking
// every line. It stops at the first malformed line with a *ParseError naming
// the line and the reason, or at the first error fn returns (wrapped). It
// returns the tensor names and the output tensors once the input is consumed.
func Parse(r io.Reader, opt ParseOptions, fn func(Instr) error) (names []string, outputs []int32, err error) {
	p := newParser(opt)
	if err := p.run(r, fn); err != nil {
		return nil, nil, err
	}
	return p.names, p.outputs(), nil
}

// rawLine is the JSON shape of one trace line. Pointers tell a missing field
// from an empty one.
type rawLine struct {
	Instruction *string            `json:"INSTRUCTION"`
	Name        *string            `json:"NAME"`
	Memory      json.RawMessage    `json:"MEMORY"`
	Time        json.RawMessage    `json:"TIME"`
	Alias       json.RawMessage    `json:"ALIAS"`
	Args        *[]string          `json:"ARGS"`
	Result      *[]string          `json:"RESULT"`
	Mutate      *[]json.RawMessage `json:"MUTATE"`
	Dst         *string            `json:"DST"`
	Src         *string            `json:"SRC"`
	Annotation  *string            `json:"ANNOTATION"`
}

type pendingKind uint8

const (
	pendNone pendingKind = iota
	pendConstMemory
	pendCallMemory
	pendCallAlias
)

type parser struct {
	opt       ParseOptions
	line      int
	started   bool
	startLine int
	ignored   int

	// name state (valid after START)
	nameTensor map[string]int32  // name -> tensor
	nameOrder  []string          // names in first-insertion order
	names      []string          // tensor -> creation name
	refs       []int32           // tensor -> references
	storSize   []uint64          // tensor -> size of the storage it lives in
	ops        map[string]string // interned op names (intern)

	// instruction being assembled from several lines
	pend     pendingKind
	pendLine int
	cur      Instr
	curNames []string // CONSTANT name or CALL result names
	curIdx   int      // next result to complete
}

func newParser(opt ParseOptions) *parser {
	if opt.MaxLineBytes <= 0 {
		opt.MaxLineBytes = 16 << 20
	}
	return &parser{opt: opt, nameTensor: map[string]int32{}, ops: map[string]string{}, started: opt.NoStart}
}

func (p *parser) errf(format string, args ...any) error {
	return &ParseError{Line: p.line, Reason: fmt.Sprintf(format, args...)}
}

func (p *parser) run(r io.Reader, fn func(Instr) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, min(64<<10, p.opt.MaxLineBytes)), p.opt.MaxLineBytes)
	for sc.Scan() {
		p.line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if err := p.handle(b, fn); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return &ParseError{Line: p.line + 1, Reason: fmt.Sprintf("line longer than %d bytes", p.opt.MaxLineBytes)}
		}
		return fmt.Errorf("dtr trace: reading line %d: %w", p.line+1, err)
	}
	if p.pend != pendNone {
		return &ParseError{Reason: p.incomplete()}
	}
	if !p.started {
		return &ParseError{Reason: "no START annotation (set NoStart to replay from the first line)"}
	}
	return nil
}

// incomplete describes the multi-line instruction still waiting for lines.
func (p *parser) incomplete() string {
	switch p.pend {
	case pendConstMemory:
		return fmt.Sprintf("CONSTANT %s at line %d has no MEMORY line", p.curNames[0], p.pendLine)
	default:
		return fmt.Sprintf("result count mismatch: CALL %s at line %d declares %d results but only %d MEMORY/ALIAS pairs follow",
			p.cur.Op, p.pendLine, len(p.curNames), p.curIdx)
	}
}

func (p *parser) handle(b []byte, fn func(Instr) error) error {
	var raw rawLine
	if !decodeFast(b, &raw) {
		raw = rawLine{}
		if err := json.Unmarshal(b, &raw); err != nil {
			return p.errf("bad JSON: %v", err)
		}
	}
	if raw.Instruction == nil {
		return p.errf("missing field INSTRUCTION")
	}
	instr := *raw.Instruction
	switch instr {
	case "CONSTANT", "MEMORY", "ALIAS", "CALL", "MUTATE", "COPY", "COPY_FROM", "RELEASE", "ANNOTATE":
	default:
		return p.errf("unknown instruction %q", instr)
	}

	// Lines that continue a CONSTANT or CALL.
	if p.pend != pendNone {
		return p.continuation(instr, &raw, fn)
	}
	switch instr {
	case "CONSTANT":
		name, err := p.str(raw.Name, "NAME")
		if err != nil {
			return err
		}
		p.cur = Instr{Kind: KindConstant, Line: p.line}
		p.curNames = append(p.curNames[:0], name)
		p.pend, p.pendLine = pendConstMemory, p.line
		return nil
	case "MEMORY", "ALIAS":
		name, _ := p.str(raw.Name, "NAME")
		return p.errf("%s for unknown name %q (no CONSTANT or CALL result is waiting for it)", instr, name)
	case "CALL":
		return p.call(&raw, fn)
	case "MUTATE":
		return p.mutate(&raw, fn)
	case "COPY", "COPY_FROM":
		return p.copy(instr, &raw, fn)
	case "RELEASE":
		name, err := p.str(raw.Name, "NAME")
		if err != nil {
			return err
		}
		if !p.started {
			return nil
		}
		t, ok := p.nameTensor[name]
		if !ok {
			p.ignored++
			return nil
		}
		if p.refs[t] <= 0 {
			return p.errf("RELEASE %s: tensor has no references left", name)
		}
		p.refs[t]--
		return p.emit(fn, Instr{Kind: KindRelease, Line: p.line, T: t})
	case "ANNOTATE":
		a, err := p.str(raw.Annotation, "ANNOTATION")
		if err != nil {
			return err
		}
		switch a {
		case AnnotationStart:
			if !p.started {
				p.started, p.startLine = true, p.line
			}
			return nil
		case AnnotationBackward:
			if !p.started {
				return nil
			}
			return p.emit(fn, Instr{Kind: KindAnnotate, Line: p.line, Op: a})
		default:
			return p.errf("unknown annotation %q", a)
		}
	}
	return nil
}

func (p *parser) emit(fn func(Instr) error, in Instr) error {
	if err := fn(in); err != nil {
		return fmt.Errorf("dtr trace: line %d: %w", in.Line, err)
	}
	return nil
}

func (p *parser) str(s *string, field string) (string, error) {
	if s == nil {
		return "", p.errf("missing field %s", field)
	}
	return *s, nil
}

// number reads a field holding an integer, as a JSON number or a string.
func (p *parser) number(raw json.RawMessage, field string) (int64, error) {
	if raw == nil {
		return 0, p.errf("missing field %s", field)
	}
	s := string(raw)
	if len(raw) > 0 && raw[0] == '"' {
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, p.errf("bad %s %s: %v", field, raw, err)
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, p.errf("non-numeric %s %q", field, s)
	}
	return v, nil
}

func (p *parser) newTensor(name string, storSize uint64) int32 {
	t := int32(len(p.names))
	p.names = append(p.names, name)
	p.refs = append(p.refs, 1)
	p.storSize = append(p.storSize, storSize)
	return t
}

// bind makes name refer to t, remembering the first time a name is seen.
func (p *parser) bind(name string, t int32) {
	if _, ok := p.nameTensor[name]; !ok {
		p.nameOrder = append(p.nameOrder, name)
	}
	p.nameTensor[name] = t
}

// lookupArg is lookup for argument i of op (instr CALL or MUTATE), with the
// role named only when there is an error to report.
func (p *parser) lookupArg(name, instr, op string, i int) (int32, error) {
	if t, ok := p.nameTensor[name]; ok && p.refs[t] > 0 {
		return t, nil
	}
	return p.lookup(name, fmt.Sprintf("%s %s argument %d", instr, op, i))
}

// maxInterned bounds the op names intern keeps (a trace has a few hundred).
const maxInterned = 1 << 12

// intern returns one shared copy of an op name, so that a trace of millions
// of ops holds each name once.
func (p *parser) intern(op string) string {
	if s, ok := p.ops[op]; ok {
		return s
	}
	if len(p.ops) < maxInterned {
		p.ops[op] = op
	}
	return op
}

func (p *parser) lookup(name, role string) (int32, error) {
	t, ok := p.nameTensor[name]
	if !ok {
		return 0, p.errf("%s names unknown tensor %q", role, name)
	}
	if p.refs[t] <= 0 {
		return 0, p.errf("%s names tensor %q after its last reference was released", role, name)
	}
	return t, nil
}

func (p *parser) call(raw *rawLine, fn func(Instr) error) error {
	op, err := p.str(raw.Name, "NAME")
	if err != nil {
		return err
	}
	if raw.Args == nil {
		return p.errf("CALL %s: missing field ARGS", op)
	}
	if raw.Result == nil {
		return p.errf("CALL %s: missing field RESULT", op)
	}
	tm, err := p.number(raw.Time, "TIME")
	if err != nil {
		return err
	}
	if tm < 0 {
		return p.errf("CALL %s: negative TIME %d", op, tm)
	}
	p.cur = Instr{Kind: KindCall, Line: p.line, Op: p.intern(op), Time: tm}
	if p.started {
		p.cur.Args = make([]int32, len(*raw.Args))
		for i, a := range *raw.Args {
			if p.cur.Args[i], err = p.lookupArg(a, "CALL", op, i); err != nil {
				return err
			}
		}
	}
	p.curNames = append(p.curNames[:0], *raw.Result...)
	var seen map[string]bool
	if len(p.curNames) > 16 {
		seen = make(map[string]bool, len(p.curNames))
	}
	for i, r := range p.curNames {
		if seen != nil && seen[r] || seen == nil && slices.Contains(p.curNames[:i], r) {
			return p.errf("CALL %s: result %q listed twice", op, r)
		}
		if seen != nil {
			seen[r] = true
		}
		if _, ok := p.nameTensor[r]; ok && p.started {
			return p.errf("CALL %s: result %q is already defined", op, r)
		}
	}
	p.cur.Outs = make([]Out, len(p.curNames))
	p.curIdx = 0
	if len(p.curNames) == 0 {
		return p.finishCall(fn)
	}
	p.pend, p.pendLine = pendCallMemory, p.line
	return nil
}

// continuation handles the MEMORY and ALIAS lines that complete a CONSTANT or
// a CALL.
func (p *parser) continuation(instr string, raw *rawLine, fn func(Instr) error) error {
	want := "MEMORY"
	if p.pend == pendCallAlias {
		want = "ALIAS"
	}
	if instr != want {
		if p.pend == pendConstMemory {
			return p.errf("expected MEMORY for CONSTANT %s (line %d), got %s", p.curNames[0], p.pendLine, instr)
		}
		if instr == "MEMORY" || instr == "ALIAS" {
			return p.errf("expected %s for result %q of CALL %s (line %d), got %s", want, p.curNames[p.curIdx], p.cur.Op, p.pendLine, instr)
		}
		return p.errf("%s (got %s)", p.incomplete(), instr)
	}
	name, err := p.str(raw.Name, "NAME")
	if err != nil {
		return err
	}
	expect := p.curNames[0]
	if p.pend != pendConstMemory {
		expect = p.curNames[p.curIdx]
	}
	if name != expect {
		return p.errf("%s for unknown name %q (expected %q for the instruction at line %d)", instr, name, expect, p.pendLine)
	}
	switch p.pend {
	case pendConstMemory:
		m, err := p.number(raw.Memory, "MEMORY")
		if err != nil {
			return err
		}
		if m < 0 {
			return p.errf("negative MEMORY %d for %s", m, name)
		}
		if m > MaxSize {
			return p.errf("MEMORY %d for %s is above the maximum storage size of %d bytes (256 TiB)", m, name, int64(MaxSize))
		}
		p.pend = pendNone
		if !p.started {
			return nil
		}
		if _, ok := p.nameTensor[name]; ok {
			return p.errf("CONSTANT %s is already defined", name)
		}
		p.cur.Size = uint64(m)
		p.cur.T = p.newTensor(name, p.cur.Size)
		p.bind(name, p.cur.T)
		return p.emit(fn, p.cur)
	case pendCallMemory:
		m, err := p.number(raw.Memory, "MEMORY")
		if err != nil {
			return err
		}
		if m < 0 {
			return p.errf("negative MEMORY %d for %s", m, name)
		}
		if m > MaxSize {
			return p.errf("MEMORY %d for %s is above the maximum storage size of %d bytes (256 TiB)", m, name, int64(MaxSize))
		}
		p.cur.Outs[p.curIdx].Size = uint64(m)
		p.pend = pendCallAlias
		return nil
	default: // pendCallAlias
		a, err := p.number(raw.Alias, "ALIAS")
		if err != nil {
			return err
		}
		if a < -1 || (p.started && a >= int64(len(p.cur.Args))) {
			return p.errf("ALIAS %d for %s out of range (CALL %s has %d arguments)", a, name, p.cur.Op, len(p.cur.Args))
		}
		o := &p.cur.Outs[p.curIdx]
		o.Alias = int32(a)
		if a >= 0 {
			o.Size = 0 // an alias takes no memory of its own
		}
		p.curIdx++
		if p.curIdx < len(p.curNames) {
			p.pend = pendCallMemory
			return nil
		}
		p.pend = pendNone
		return p.finishCall(fn)
	}
}

func (p *parser) finishCall(fn func(Instr) error) error {
	if !p.started {
		return nil
	}
	for i, r := range p.curNames {
		o := &p.cur.Outs[i]
		ss := o.Size
		if o.Alias >= 0 {
			ss = p.storSize[p.cur.Args[o.Alias]]
		}
		o.T = p.newTensor(r, ss)
		p.bind(r, o.T)
	}
	return p.emit(fn, p.cur)
}

func (p *parser) mutate(raw *rawLine, fn func(Instr) error) error {
	op, err := p.str(raw.Name, "NAME")
	if err != nil {
		return err
	}
	if raw.Args == nil {
		return p.errf("MUTATE %s: missing field ARGS", op)
	}
	if raw.Mutate == nil {
		return p.errf("MUTATE %s: missing field MUTATE", op)
	}
	tm, err := p.number(raw.Time, "TIME")
	if err != nil {
		return err
	}
	if tm < 0 {
		return p.errf("MUTATE %s: negative TIME %d", op, tm)
	}
	idx := make([]int32, len(*raw.Mutate))
	for i, m := range *raw.Mutate {
		v, err := p.number(m, "MUTATE index")
		if err != nil {
			return err
		}
		if v < 0 || v >= int64(len(*raw.Args)) {
			return p.errf("MUTATE %s: index %d out of range (%d arguments)", op, v, len(*raw.Args))
		}
		for _, prev := range idx[:i] {
			if int64(prev) == v {
				return p.errf("MUTATE %s: index %d listed twice", op, v)
			}
		}
		idx[i] = int32(v)
	}
	if !p.started {
		return nil
	}
	in := Instr{Kind: KindMutate, Line: p.line, Op: p.intern(op), Time: tm, Mutated: idx}
	in.Args = make([]int32, len(*raw.Args))
	for i, a := range *raw.Args {
		if in.Args[i], err = p.lookupArg(a, "MUTATE", op, i); err != nil {
			return err
		}
	}
	in.Outs = make([]Out, len(idx))
	for i, m := range idx {
		name := (*raw.Args)[m]
		old := in.Args[m]
		size := p.storSize[old]
		in.Outs[i] = Out{T: p.newTensor(name+"$", size), Size: size, Alias: -1}
		p.bind(name, in.Outs[i].T)
		p.refs[old]--
	}
	return p.emit(fn, in)
}

func (p *parser) copy(instr string, raw *rawLine, fn func(Instr) error) error {
	dst, err := p.str(raw.Dst, "DST")
	if err != nil {
		return err
	}
	src, err := p.str(raw.Src, "SRC")
	if err != nil {
		return err
	}
	if !p.started {
		return nil
	}
	t, err := p.lookup(src, instr+" SRC")
	if err != nil {
		return err
	}
	if instr == "COPY" {
		if _, ok := p.nameTensor[dst]; ok {
			return p.errf("COPY DST %q is already defined", dst)
		}
		p.refs[t]++
		p.bind(dst, t)
		return p.emit(fn, Instr{Kind: KindCopy, Line: p.line, T: t})
	}
	old, err := p.lookup(dst, "COPY_FROM DST")
	if err != nil {
		return err
	}
	p.refs[old]--
	p.refs[t]++
	p.bind(dst, t)
	return p.emit(fn, Instr{Kind: KindCopyFrom, Line: p.line, T: t, Old: old})
}

// outputs lists the tensors still referenced at the end, in the order their
// names first appeared, each once.
func (p *parser) outputs() []int32 {
	var out []int32
	seen := make(map[int32]bool)
	for _, n := range p.nameOrder {
		t := p.nameTensor[n]
		if p.refs[t] > 0 && !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}
