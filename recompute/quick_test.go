package recompute

import (
	"os"
	"testing"

	"github.com/memscale/memscale/internal/sharedtraces"
)

func TestQuickParse(t *testing.T) {
	for _, tr := range sharedtraces.ForTest(t) {
		f, _ := os.Open(tr.Path)
		x, err := ReadTrace(f, ParseOptions{})
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Log(tr.Name, len(x.Instrs), x.NumTensors(), len(x.Outputs), x.IgnoredReleases)
	}
}
