package sweep

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	rc "github.com/memscale/memscale/recompute"

	"github.com/memscale/memscale/internal/sharedtraces"
)

func TestLoadPlainAndGzip(t *testing.T) {
	dir := t.TempDir()
	text := chainTrace(4, 100)
	plain := writeFile(t, dir, "chain.log", text, false)
	gz := writeFile(t, dir, "chain.log.gz", text, true)
	// gzip is recognised by content, not by name
	gzNoExt := writeFile(t, dir, "chain-gz.log", text, true)

	want, err := rc.LoadTrace(plain)
	require.NoError(t, err)
	require.NotZero(t, want.Len())
	for _, p := range []string{gz, gzNoExt} {
		got, err := rc.LoadTrace(p)
		require.NoError(t, err, p)
		assert.Equal(t, want, got, p)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	good := chainTrace(2, 10)
	tests := []struct {
		name    string
		content string
		gz      bool
		wantErr []string
	}{
		{name: "empty.log", content: "", wantErr: []string{"empty.log", "no START annotation"}},
		{name: "json.log", content: `{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}` + "\n{not json\n", wantErr: []string{"json.log", "line 2", "bad JSON"}},
		{name: "unknown.log", content: `{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}` + "\n" + `{"INSTRUCTION":"CALL","NAME":"f","ARGS":["nope"],"RESULT":[],"TIME":"1"}` + "\n",
			wantErr: []string{"unknown.log", "line 2", `unknown tensor "nope"`}},
		{name: "truncated.log.gz", content: good[:len(good)/2], gz: true, wantErr: []string{"truncated.log.gz"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, dir, tc.name, tc.content, tc.gz)
			_, err := rc.LoadTrace(p)
			require.Error(t, err)
			for _, w := range tc.wantErr {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	t.Run("corrupt gzip", func(t *testing.T) {
		p := filepath.Join(dir, "corrupt.gz")
		require.NoError(t, os.WriteFile(p, []byte{0x1f, 0x8b, 0, 1, 2, 3}, 0o644))
		_, err := rc.LoadTrace(p)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "corrupt.gz")
		assert.Contains(t, err.Error(), "gzip")
	})
	t.Run("missing file", func(t *testing.T) {
		_, err := rc.LoadTrace(filepath.Join(dir, "absent.log"))
		require.Error(t, err)
		assert.True(t, errors.Is(err, os.ErrNotExist))
		assert.Contains(t, err.Error(), "absent.log")
	})
}

func TestResolve(t *testing.T) {
	dir := t.TempDir()
	a := writeFile(t, dir, "model.log", chainTrace(1, 1), false)
	sub := filepath.Join(dir, "sub")
	require.NoError(t, os.Mkdir(sub, 0o755))
	b := writeFile(t, sub, "model.log.gz", chainTrace(1, 1), true)
	shared := []sharedtraces.Trace{
		{Name: "lstm", Path: "/s/lstm-128.log"},
		{Name: "resnet32", Path: "/s/resnet32-56.log"},
		{Name: "tv_densenet121", Path: "/s/tv_densenet121-84.log"},
		{Name: "unet", Path: "/s/unet-6.log"},
	}
	lister := func() ([]sharedtraces.Trace, error) { return shared, nil }
	broken := func() ([]sharedtraces.Trace, error) { return nil, errors.New("shared DTR traces not found") }

	tests := []struct {
		name    string
		args    []string
		lister  SharedLister
		want    []Input
		wantErr string
	}{
		{name: "path", args: []string{a}, lister: lister, want: []Input{{Name: "model", Path: a}}},
		{name: "same stem twice", args: []string{a, b}, lister: lister, want: []Input{{Name: "model", Path: a}, {Name: "model-2", Path: b}}},
		{name: "same file twice", args: []string{a, a}, lister: lister, want: []Input{{Name: "model", Path: a}}},
		{name: "shared name", args: []string{"unet"}, lister: lister, want: []Input{{Name: "unet", Path: "/s/unet-6.log"}}},
		{name: "unique part of a name", args: []string{"densenet"}, lister: lister, want: []Input{{Name: "tv_densenet121", Path: "/s/tv_densenet121-84.log"}}},
		{name: "all-shared", args: []string{"unet", AllShared}, lister: lister, want: []Input{
			{Name: "unet", Path: "/s/unet-6.log"}, {Name: "lstm", Path: "/s/lstm-128.log"},
			{Name: "resnet32", Path: "/s/resnet32-56.log"}, {Name: "tv_densenet121", Path: "/s/tv_densenet121-84.log"},
		}},
		{name: "path without shared traces", args: []string{a}, lister: broken, want: []Input{{Name: "model", Path: a}}},
		{name: "none", args: nil, lister: lister, wantErr: "no trace given"},
		{name: "empty argument", args: []string{""}, lister: lister, wantErr: "empty trace argument"},
		{name: "unknown", args: []string{"gpt5"}, lister: lister, wantErr: `trace "gpt5": no such file and no shared trace of that name (shared: lstm, resnet32, tv_densenet121, unet, or all-shared)`},
		{name: "ambiguous", args: []string{"e"}, lister: lister, wantErr: `trace "e": ambiguous shared trace name`},
		{name: "directory", args: []string{dir}, lister: lister, wantErr: "is a directory"},
		{name: "shared unavailable", args: []string{"unet"}, lister: broken, wantErr: `trace "unet": no such file, and the shared traces are unavailable: shared DTR traces not found`},
		{name: "all-shared unavailable", args: []string{AllShared}, lister: broken, wantErr: "trace all-shared: shared DTR traces not found"},
		{name: "all-shared empty", args: []string{AllShared}, lister: func() ([]sharedtraces.Trace, error) { return nil, nil }, wantErr: "no shared traces found"},
		{name: "no lister", args: []string{"unet"}, lister: nil, wantErr: "no shared traces configured"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Resolve(tc.args, tc.lister)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestStem(t *testing.T) {
	for in, want := range map[string]string{
		"/a/b/unet-6.log":  "unet-6",
		"x.log.gz":         "x",
		"x.gz":             "x",
		"noext":            "noext",
		"/a/.log":          "trace",
		"dir/model.v2.log": "model.v2",
	} {
		assert.Equal(t, want, stem(in), in)
	}
	assert.False(t, strings.Contains(stem("a/b/c.log"), "/"))
}
