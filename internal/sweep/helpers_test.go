package sweep

import (
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// chainTrace returns a DTR trace of an n-layer chain trained for one step:
// a forward pass keeping every activation (size bytes each, layer i costing
// 1000*(i+1) ns), then a backward pass releasing them in reverse.
func chainTrace(n int, size int) string {
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	out := func(name string, mem int, alias int) {
		line(`{"INSTRUCTION":"MEMORY","NAME":%q,"MEMORY":"%d"}`, name, mem)
		line(`{"INSTRUCTION":"ALIAS","NAME":%q,"ALIAS":"%d"}`, name, alias)
	}
	line(`{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}`)
	line(`{"INSTRUCTION":"CONSTANT","NAME":"a0"}`)
	line(`{"INSTRUCTION":"MEMORY","NAME":"a0","MEMORY":"%d"}`, size)
	for i := 1; i <= n; i++ {
		line(`{"INSTRUCTION":"CALL","NAME":"layer","ARGS":["a%d"],"RESULT":["a%d"],"TIME":"%d"}`, i-1, i, 1000*i)
		out(fmt.Sprintf("a%d", i), size, -1)
	}
	line(`{"INSTRUCTION":"ANNOTATE","ANNOTATION":"BACKWARD"}`)
	line(`{"INSTRUCTION":"CALL","NAME":"loss_grad","ARGS":["a%d"],"RESULT":["g%d"],"TIME":"500"}`, n, n)
	out(fmt.Sprintf("g%d", n), size, -1)
	line(`{"INSTRUCTION":"RELEASE","NAME":"a%d"}`, n)
	for i := n; i >= 1; i-- {
		line(`{"INSTRUCTION":"CALL","NAME":"layer_grad","ARGS":["g%d","a%d"],"RESULT":["g%d"],"TIME":"%d"}`, i, i-1, i-1, 1500*i)
		out(fmt.Sprintf("g%d", i-1), size, -1)
		line(`{"INSTRUCTION":"RELEASE","NAME":"g%d"}`, i)
		if i > 1 {
			line(`{"INSTRUCTION":"RELEASE","NAME":"a%d"}`, i-1)
		}
	}
	return b.String()
}

// writeFile writes content to name in dir, gzip-compressed if gz.
func writeFile(t testing.TB, dir, name, content string, gz bool) string {
	t.Helper()
	p := filepath.Join(dir, name)
	f, err := os.Create(p)
	require.NoError(t, err)
	defer f.Close()
	if gz {
		zw := gzip.NewWriter(f)
		_, err = zw.Write([]byte(content))
		require.NoError(t, err)
		require.NoError(t, zw.Close())
	} else {
		_, err = f.WriteString(content)
		require.NoError(t, err)
	}
	return p
}
