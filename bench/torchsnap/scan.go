package torchsnap

import (
	"encoding/binary"
	"fmt"
)

// argKind is the shape of a pickle opcode's argument (pickletools' table).
type argKind uint8

const (
	argNone  argKind = iota
	argFixed         // n bytes
	argLen1          // 1-byte length, then that many bytes
	argLen4          // 4-byte little-endian length
	argLen8          // 8-byte little-endian length
	argLine          // up to a newline
	argLine2         // two lines
	argFrame         // 8-byte frame length, the frame's opcodes follow
)

type opArg struct {
	kind argKind
	n    int
	name string
}

// opcodes lists every opcode of pickle protocols 0-5 with its argument.
var opcodes = func() [256]*opArg {
	var t [256]*opArg
	for _, c := range []byte("(.012N)]}aeltdsubRo\x81\x85\x86\x87\x88\x89\x8f\x90\x91\x92\x93\x94Q\x97\x98") {
		t[c] = &opArg{kind: argNone}
	}
	fixed := map[byte]int{'K': 1, 'q': 1, 'h': 1, 0x80: 1, 0x82: 1, 'M': 2, 0x83: 2, 'J': 4, 'r': 4, 'j': 4, 0x84: 4, 'G': 8}
	for c, n := range fixed {
		t[c] = &opArg{kind: argFixed, n: n}
	}
	for _, c := range []byte{'U', 'C', 0x8c, 0x8a} {
		t[c] = &opArg{kind: argLen1}
	}
	for _, c := range []byte{'T', 'B', 'X', 0x8b} {
		t[c] = &opArg{kind: argLen4}
	}
	for _, c := range []byte{0x8d, 0x8e, 0x96} {
		t[c] = &opArg{kind: argLen8}
	}
	for _, c := range []byte{'I', 'L', 'F', 'S', 'V', 'P', 'g', 'p'} {
		t[c] = &opArg{kind: argLine}
	}
	t['c'] = &opArg{kind: argLine2}
	t['i'] = &opArg{kind: argLine2}
	t[0x95] = &opArg{kind: argFrame}
	return t
}()

// scan walks the opcodes of a pickle up to STOP and checks every length
// against the bytes that remain, so that decoding a corrupt file never
// allocates more than the file holds. It returns an error naming the byte
// offset of the first bad opcode.
func scan(data []byte) error {
	i := 0
	need := func(at, n int, what string) error {
		if n < 0 || at+n > len(data) || at+n < at {
			return fmt.Errorf("truncated pickle: %s at byte %d needs %d bytes, the file ends at byte %d", what, at, n, len(data))
		}
		return nil
	}
	for i < len(data) {
		op := data[i]
		a := opcodes[op]
		if a == nil {
			return fmt.Errorf("corrupt pickle near byte %d: unknown opcode 0x%02x", i, op)
		}
		at := i
		i++
		switch a.kind {
		case argNone:
			if op == '.' {
				return nil
			}
		case argFixed:
			if err := need(i, a.n, fmt.Sprintf("opcode 0x%02x", op)); err != nil {
				return err
			}
			i += a.n
		case argLen1, argLen4, argLen8:
			w := map[argKind]int{argLen1: 1, argLen4: 4, argLen8: 8}[a.kind]
			if err := need(i, w, fmt.Sprintf("the length of opcode 0x%02x", op)); err != nil {
				return err
			}
			var n uint64
			switch w {
			case 1:
				n = uint64(data[i])
			case 4:
				n = uint64(binary.LittleEndian.Uint32(data[i:]))
			default:
				n = binary.LittleEndian.Uint64(data[i:])
			}
			i += w
			if n > uint64(len(data)-i) {
				return fmt.Errorf("corrupt or truncated pickle: opcode 0x%02x at byte %d announces %d bytes, %d remain", op, at, n, len(data)-i)
			}
			i += int(n)
		case argFrame:
			if err := need(i, 8, "a frame length"); err != nil {
				return err
			}
			n := binary.LittleEndian.Uint64(data[i:])
			i += 8
			if n > uint64(len(data)-i) {
				return fmt.Errorf("truncated pickle: the frame at byte %d announces %d bytes, %d remain", at, n, len(data)-i)
			}
		case argLine, argLine2:
			lines := 1
			if a.kind == argLine2 {
				lines = 2
			}
			for ; lines > 0; lines-- {
				for i < len(data) && data[i] != '\n' {
					i++
				}
				if i == len(data) {
					return fmt.Errorf("truncated pickle: opcode 0x%02x at byte %d has no end of line", op, at)
				}
				i++
			}
		}
	}
	return fmt.Errorf("truncated pickle: the file ends at byte %d before the pickle's STOP", len(data))
}
