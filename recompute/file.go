package recompute

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
)

// LoadTrace parses the DTR trace at path (ReadTrace with default options).
// A gzip-compressed file, recognised by its magic bytes whatever its name,
// is decompressed on the fly. Errors name the file.
func LoadTrace(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	defer f.Close()
	tr, err := DecodeTrace(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return tr, nil
}

// DecodeTrace parses a whole DTR trace from r, decompressing it if it is
// gzip.
func DecodeTrace(r io.Reader) (*Trace, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	magic, err := br.Peek(2)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("reading: %w", err)
	}
	var src io.Reader = br
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		defer zr.Close()
		src = zr
	}
	return ReadTrace(src, ParseOptions{})
}
