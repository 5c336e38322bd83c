package replaybench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/memscale/memscale/bench/torchsnap"
	"github.com/memscale/memscale/bench/workload"
	"github.com/memscale/memscale/internal/sweep"
)

// Formats lists the input formats Load recognizes.
const Formats = "a PyTorch memory snapshot pickle (torch.cuda.memory._dump_snapshot, memscale.record_snapshot), " +
	"a DTR/memscale trace (.log or .log.gz, one JSON object per line), an RMM replay log (CSV with the header Thread,Time,Action,Pointer,Size,Stream)"

// Load resolves the INPUT arguments of `memscale bench replay` - files, the
// names of shared DTR traces, or all-shared - and reads each. device picks
// the device of a snapshot (-1 = the busiest).
func Load(args []string, shared sweep.SharedLister, device int) ([]*workload.Workload, error) {
	inputs, err := sweep.Resolve(args, shared)
	if err != nil {
		return nil, err
	}
	var out []*workload.Workload
	for _, in := range inputs {
		w, err := ReadFile(in.Path, shortName(in.Name), device)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, nil
}

// shortName strips the extensions sweep.Resolve leaves.
func shortName(n string) string {
	for _, ext := range []string{".pickle", ".pkl", ".csv", ".log"} {
		n = strings.TrimSuffix(n, ext)
	}
	return n
}

// ReadFile reads one input, recognizing its format from its first bytes.
func ReadFile(path, name string, device int) (*workload.Workload, error) {
	if name == "" {
		name = shortName(filepath.Base(path))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	head, _ := bufio.NewReader(f).Peek(256)
	f.Close()
	switch {
	case len(head) == 0:
		return nil, fmt.Errorf("%s: empty file; want %s", path, Formats)
	case head[0] == 0x80:
		s, err := torchsnap.ReadFile(path)
		if err != nil {
			return nil, err
		}
		w, err := s.Workload(name, path, torchsnap.Options{Device: device})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return w, nil
	case len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b, head[0] == '{':
		return workload.ReadDTR(path, name)
	}
	first, _, _ := bytes.Cut(head, []byte("\n"))
	if bytes.Contains(first, []byte("Action")) {
		return workload.ReadRMM(path, name)
	}
	return nil, fmt.Errorf("%s: unrecognized format (starts with %q); want %s", path, truncate(head, 24), Formats)
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	return string(b)
}
