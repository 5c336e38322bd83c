package replaybench

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/bench/workload"
	"github.com/memscale/memscale/device/cuda"
)

const mib = 1 << 20

// ladder allocates n blocks of 3 MiB, frees every other one, then asks
// for n/2 blocks of 5 MiB: a segment allocator without VMM cannot reuse the
// 3 MiB holes.
func ladder(n int) *workload.Workload {
	b := workload.NewBuilder("ladder", "", "test")
	key := uint64(1)
	var keys []uint64
	for i := 0; i < n; i++ {
		must(b.Alloc(key, 3*mib, 0))
		keys = append(keys, key)
		key++
	}
	for i := 0; i < n; i += 2 {
		b.Free(keys[i])
	}
	for i := 0; i < n/2; i++ {
		must(b.Alloc(key, 5*mib, 0))
		key++
	}
	return b.Finish()
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func specs(t *testing.T, names ...string) []Spec {
	var out []Spec
	for _, n := range names {
		s, err := Lookup(n)
		require.NoError(t, err)
		out = append(out, s)
	}
	return out
}

func TestRunLadder(t *testing.T) {
	w := ladder(40)
	res, err := Run(context.Background(), w, specs(t, "memscale", "torch", "torch-expandable"), Options{Env: Env{Capacity: 4 << 30}, TimelinePoints: 10})
	require.NoError(t, err)
	require.Len(t, res, 3)
	for _, r := range res {
		assert.Empty(t, r.Error, r.Allocator)
		assert.Equal(t, uint64(160*mib), r.PeakRequested, r.Allocator) // 20 x 3 MiB + 20 x 5 MiB
		assert.Equal(t, 60, r.Mallocs, r.Allocator)
		assert.Equal(t, 20, r.Frees, r.Allocator)
		assert.LessOrEqual(t, len(r.Timeline), 10, r.Allocator)
		assert.Equal(t, len(w.Ops)-1, r.Timeline[len(r.Timeline)-1].Op)
		assert.GreaterOrEqual(t, r.PeakReserved, r.PeakAllocated)
		assert.Greater(t, r.OpsPerSec, 0.0)
		assert.Nil(t, r.OOM)
	}
	byName := map[string]Result{}
	for _, r := range res {
		byName[r.Allocator] = r
	}
	// The model cuts 20 MiB segments into six 3 MiB blocks (2 MiB left
	// each); the freed 3 MiB holes between live blocks cannot hold 5 MiB, so
	// it needs new segments, where memscale remaps the holes' granules.
	assert.Greater(t, byName["torch"].PeakReserved, byName["memscale"].PeakReserved)
	assert.Greater(t, byName["torch"].Fragmentation, byName["memscale"].Fragmentation)
	// memscale counts its granule traffic; the models do not.
	m := byName["memscale"]
	assert.True(t, m.Mapping)
	assert.Positive(t, m.Maps)
	assert.GreaterOrEqual(t, m.Maps, m.Remaps)
	assert.GreaterOrEqual(t, m.Unmaps, m.Remaps)
	assert.False(t, byName["torch"].Mapping)
	var md strings.Builder
	require.NoError(t, WriteMarkdown(&md, &Report{Workloads: []WorkloadInfo{{Name: w.Name}}, Results: res}))
	assert.Contains(t, md.String(), fmt.Sprintf("| %d / %d / %d |", m.Maps, m.Unmaps, m.Remaps))
}

// TestRunSteps: --steps replays the workload several times through one
// allocator and reports each step's granule traffic, which adds up to the
// totals.
func TestRunSteps(t *testing.T) {
	w := ladder(40)
	res, err := Run(context.Background(), w, specs(t, "memscale", "torch"), Options{Env: Env{Capacity: 4 << 30}, Steps: 3})
	require.NoError(t, err)
	for _, r := range res {
		assert.Empty(t, r.Error, r.Allocator)
		assert.Equal(t, 3*60, r.Mallocs, r.Allocator)
		require.Len(t, r.Steps, 3, r.Allocator)
		var maps, unmaps, remaps int64
		for _, s := range r.Steps {
			maps += s.Maps
			unmaps += s.Unmaps
			remaps += s.Remaps
			assert.Positive(t, s.MallocP99, r.Allocator)
		}
		assert.Equal(t, []int64{r.Maps, r.Unmaps, r.Remaps}, []int64{maps, unmaps, remaps}, r.Allocator)
		assert.Equal(t, len(w.Ops)-1, r.Timeline[len(r.Timeline)-1].Op, "the timeline is the first step's")
	}
	var tab strings.Builder
	require.NoError(t, WriteTable(&tab, WorkloadInfo{Name: w.Name}, res))
	assert.Contains(t, tab.String(), "remaps per step: ")
}

func TestRunLimit(t *testing.T) {
	w := ladder(40)
	res, err := Run(context.Background(), w, specs(t, "memscale", "torch"), Options{Env: Env{Capacity: 4 << 30, Limit: 150 * mib}})
	require.NoError(t, err)
	for _, r := range res {
		require.NotNil(t, r.OOM, r.Allocator)
		assert.Empty(t, r.Error, r.Allocator)
		assert.Equal(t, uint64(150*mib), r.Limit)
		// The replay goes on without the limit: the peaks are the whole run's.
		assert.Equal(t, 60, r.Mallocs)
		assert.Greater(t, r.PeakReserved, uint64(150*mib))
		assert.Greater(t, r.OOM.Op, 40, "%s fails only in the 5 MiB phase", r.Allocator)
	}
}

func TestLookup(t *testing.T) {
	s, err := Lookup("torch[max_split_size_mb:64,roundup_power2_divisions:4]")
	require.NoError(t, err)
	assert.Contains(t, s.Describe, "max_split_size_mb:64,roundup_power2_divisions:4")
	_, err = Lookup("torch[max_split_size_mb:2]")
	assert.ErrorContains(t, err, "must be > 20")
	_, err = Lookup("jemalloc")
	assert.ErrorContains(t, err, "unknown allocator \"jemalloc\"")
	s, err = Lookup("cuda-malloc")
	require.NoError(t, err)
	_, err = s.New(Env{Backend: BackendSim})
	assert.ErrorContains(t, err, "only with --backend cuda")
}

func TestCUDABackendWithoutGPU(t *testing.T) {
	if cuda.Available() == nil {
		if n, err := cuda.DeviceCount(); err == nil && n > 0 {
			t.Skip("a GPU is present")
		}
	}
	for _, name := range []string{"memscale", "cuda-malloc"} {
		s, err := Lookup(name)
		require.NoError(t, err)
		_, err = RunOne(context.Background(), ladder(4), s, Options{Env: Env{Backend: BackendCUDA}})
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "--backend cuda needs an NVIDIA GPU", name)
	}
}

func TestLoadFormats(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(data), 0o644))
		return p
	}
	rmm := write("r.csv", "Thread,Time,Action,Pointer,Size,Stream\n1,1,allocate,0x10,100,0x0\n1,1,free,0x10,100,0x0\n")
	dtr := write("d.log", `{"INSTRUCTION":"CONSTANT","NAME":"x"}`+"\n"+`{"INSTRUCTION":"MEMORY","NAME":"x","MEMORY":"64"}`+"\n")
	junk := write("j.txt", "hello\nworld\n")
	empty := write("e.bin", "")
	ws, err := Load([]string{rmm, dtr, "../../samples/snapshots/mlp-train.pickle"}, nil, -1)
	require.NoError(t, err)
	require.Len(t, ws, 3)
	assert.Equal(t, []string{"rmm-log", "dtr-trace", "torch-snapshot"}, []string{ws[0].Format, ws[1].Format, ws[2].Format})
	assert.Equal(t, []string{"r", "d", "mlp-train"}, []string{ws[0].Name, ws[1].Name, ws[2].Name})
	_, err = Load([]string{junk}, nil, -1)
	assert.ErrorContains(t, err, "unrecognized format")
	assert.ErrorContains(t, err, "RMM replay log")
	_, err = Load([]string{empty}, nil, -1)
	assert.ErrorContains(t, err, "empty file")
	_, err = Load([]string{filepath.Join(dir, "missing.pickle")}, nil, -1)
	assert.Error(t, err)
}

func TestOutputs(t *testing.T) {
	w := ladder(10)
	res, err := Run(context.Background(), w, specs(t, "memscale", "torch"), Options{Env: Env{Capacity: 1 << 30, Limit: 40 * mib}})
	require.NoError(t, err)
	rep := &Report{Workloads: []WorkloadInfo{Info(w)}, Results: res}

	var table bytes.Buffer
	require.NoError(t, WriteTable(&table, rep.Workloads[0], res))
	for _, want := range []string{"ladder (test, 20 ops", "peak reserved", "memscale", "torch", "first OOM under limit", "op "} {
		assert.Contains(t, table.String(), want)
	}

	var c bytes.Buffer
	require.NoError(t, WriteCSV(&c, rep))
	rows, err := csv.NewReader(&c).ReadAll()
	require.NoError(t, err)
	require.Len(t, rows, 3)
	assert.Equal(t, csvHeader, rows[0])
	assert.Equal(t, "ladder", rows[1][0])
	assert.Equal(t, "test", rows[1][1])

	var j bytes.Buffer
	require.NoError(t, WriteJSON(&j, rep))
	var back Report
	require.NoError(t, json.Unmarshal(j.Bytes(), &back))
	assert.Equal(t, rep.Results[1].PeakReserved, back.Results[1].PeakReserved)
	assert.NotEmpty(t, back.Results[0].Timeline)

	var md bytes.Buffer
	require.NoError(t, WriteMarkdown(&md, rep))
	assert.Contains(t, md.String(), "| memscale | ")
	assert.Contains(t, md.String(), "| +0.0% |")
	assert.Contains(t, md.String(), "| workload | peak requested | memscale: peak reserved (fragmentation) | torch: peak reserved (fragmentation) |")

	var png bytes.Buffer
	require.NoError(t, WritePlot(&png, rep))
	assert.True(t, strings.HasPrefix(png.String(), "\x89PNG"))
	assert.Error(t, WritePlot(&png, &Report{}))
}
