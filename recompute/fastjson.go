package recompute

import "encoding/json"

// decodeFast fills raw from b when b is a trace line of the plain shape
// trace writers produce: one JSON object, no whitespace, keys among the
// upper-case field names of rawLine, values strings (or, for ARGS and
// RESULT, arrays of strings) of printable ASCII without escapes. It returns
// false for anything else, leaving raw partly filled: the caller then
// decodes the line with encoding/json, which decides what every other line
// means (case-insensitive keys, escapes, numbers, null, MUTATE's arrays,
// errors). On the lines it accepts the two agree, a later duplicate key
// included; the property is checked by FuzzDecodeFast and TestDecodeFast.
// The raw numbers (MEMORY, TIME, ALIAS) point into b, which must outlive
// their use.
//
// encoding/json spends most of a parse of a large trace in reflection
// (about 6 us a line); this takes well under one.
func decodeFast(b []byte, raw *rawLine) bool {
	if len(b) < 2 || b[0] != '{' {
		return false
	}
	i := 1
	if b[i] == '}' {
		return len(b) == 2
	}
	for {
		key, j, ok := fastString(b, i)
		if !ok || j >= len(b) || b[j] != ':' {
			return false
		}
		i = j + 1
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case '"':
			val, j, ok := fastString(b, i)
			if !ok {
				return false
			}
			if !fastField(raw, string(key), val, b[i:j]) {
				return false
			}
			i = j
		case '[':
			var list *[]string
			switch string(key) {
			case "ARGS":
				raw.Args = new([]string)
				list = raw.Args
			case "RESULT":
				raw.Result = new([]string)
				list = raw.Result
			default:
				return false
			}
			i++
			if i < len(b) && b[i] == ']' {
				i++
				break
			}
			for {
				val, j, ok := fastString(b, i)
				if !ok || j >= len(b) {
					return false
				}
				*list = append(*list, string(val))
				i = j + 1
				if b[j] == ']' {
					break
				}
				if b[j] != ',' {
					return false
				}
			}
		default:
			return false
		}
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i++
		case '}':
			return i+1 == len(b)
		default:
			return false
		}
	}
}

// fastField stores a string value (val without quotes, quoted with them)
// under key; false for a key it does not handle.
func fastField(raw *rawLine, key string, val, quoted []byte) bool {
	switch key {
	case "INSTRUCTION":
		raw.Instruction = instrName(val)
	case "NAME":
		raw.Name = ptr(string(val))
	case "DST":
		raw.Dst = ptr(string(val))
	case "SRC":
		raw.Src = ptr(string(val))
	case "ANNOTATION":
		raw.Annotation = ptr(string(val))
	case "MEMORY":
		raw.Memory = json.RawMessage(quoted)
	case "TIME":
		raw.Time = json.RawMessage(quoted)
	case "ALIAS":
		raw.Alias = json.RawMessage(quoted)
	default:
		return false
	}
	return true
}

func ptr(s string) *string { return &s }

// instrNames are the instruction names, shared by every line that names one.
var instrNames = []string{"CONSTANT", "MEMORY", "ALIAS", "CALL", "MUTATE", "COPY", "COPY_FROM", "RELEASE", "ANNOTATE"}

// instrName returns a pointer to the shared copy of an instruction name (a
// fresh string for an unknown one).
func instrName(b []byte) *string {
	for i := range instrNames {
		if string(b) == instrNames[i] {
			return &instrNames[i]
		}
	}
	return ptr(string(b))
}

// fastString reads the JSON string at b[i] made of printable ASCII with no
// escapes: its contents and the index just past its closing quote.
func fastString(b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return nil, 0, false
		}
	}
	return nil, 0, false
}
