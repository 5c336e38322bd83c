package allocbench

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/allocator"
	"github.com/memscale/memscale/device/sim"
	"github.com/memscale/memscale/internal/sharedtraces"
)

var resultsPath = flag.String("allocbench.results", "", "write the trace-replay tables (markdown) to this file")

// simCapacity is the simulated card: large enough that no trace comes near
// it (sim reserves address space only; memory is what is mapped).
const simCapacity = 64 << 30

// configs are the allocator set-ups compared; the first is the default and
// must meet the fragmentation target.
var configs = []struct {
	name string
	cfg  allocator.Config
}{
	{"expandable, default (CacheSlack 0)", allocator.Config{}},
	{"expandable, CacheSlack 0.05", allocator.Config{CacheSlack: 0.05}},
	{"expandable, no remap (CacheSlack -1)", allocator.Config{CacheSlack: -1}},
	{"Device.Alloc segments (no VMM)", allocator.Config{DisableVMM: true}},
}

// maxFragmentation is the target for the default configuration.
const maxFragmentation = 0.05

// loopPasses is the number of back-to-back replays in TestTraceReplayLoop.
const loopPasses = 4

// sections collects the markdown tables the tests produce, in order.
var sections []string

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if code == 0 && *resultsPath != "" && len(sections) > 0 {
		if err := os.WriteFile(*resultsPath, []byte(strings.Join(sections, "\n")), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// withAllocator runs fn on a fresh allocator over a fresh sim device and
// checks that everything is returned afterwards.
func withAllocator(t testing.TB, cfg allocator.Config, fn func(a *allocator.Allocator)) {
	t.Helper()
	d, err := sim.New(sim.Config{Capacity: simCapacity})
	require.NoError(t, err)
	defer func() { _ = d.Close() }()
	cfg.Device = d
	a, err := allocator.New(cfg)
	require.NoError(t, err)
	fn(a)
	require.Zero(t, a.Allocated(), "everything freed")
	require.NoError(t, a.EmptyCache())
	require.Zero(t, d.Mapped(), "EmptyCache returns everything")
	require.NoError(t, a.Close())
}

func TestTraceReplay(t *testing.T) {
	traces := sharedtraces.ForTest(t)
	var table strings.Builder
	fmt.Fprintf(&table, "## One pass per trace\n\n")
	fmt.Fprintf(&table, "| trace | allocator | mallocs | peak requested | peak allocated | peak reserved | fragmentation | overhead | remapped granules | device allocs | Malloc+Free ops/s |\n")
	fmt.Fprintf(&table, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, st := range traces {
		tr, err := ReadFile(st.Path)
		require.NoError(t, err)
		require.Positive(t, len(tr.Events))
		for i, c := range configs {
			var res Result
			withAllocator(t, c.cfg, func(a *allocator.Allocator) {
				res, err = Replay(a, tr, 0)
				require.NoError(t, err)
			})
			frag, over := res.Fragmentation(), res.Overhead()
			t.Logf("%-15s %-38s mallocs %6d peak req %8.1f MiB alloc %8.1f MiB reserved %8.1f MiB frag %5.2f%% overhead %5.2f%% remaps %5d device allocs %5d %9.0f ops/s",
				st.Name, c.name, res.Allocs, mib(res.PeakRequested), mib(res.PeakAllocated), mib(res.PeakReserved), 100*frag, 100*over,
				res.Stats["num_remap"], res.Stats["num_device_alloc"], res.OpsPerSec())
			fmt.Fprintf(&table, "| %s | %s | %d | %.1f MiB | %.1f MiB | %.1f MiB | %.2f%% | %.2f%% | %d | %d | %.0f |\n",
				st.Name, c.name, res.Allocs, mib(res.PeakRequested), mib(res.PeakAllocated), mib(res.PeakReserved), 100*frag, 100*over,
				res.Stats["num_remap"], res.Stats["num_device_alloc"], res.OpsPerSec())
			if i == 0 {
				require.LessOrEqual(t, frag, maxFragmentation, "%s: fragmentation %.2f%% above the %.0f%% target", st.Name, 100*frag, 100*maxFragmentation)
			}
		}
	}
	sections = append(sections, header(), table.String())
}

// TestTraceReplayLoop replays each trace several times in a row, as
// training iterations, and reports what the steady state costs: granules
// mapped and moved per pass after the first.
func TestTraceReplayLoop(t *testing.T) {
	traces := sharedtraces.ForTest(t)
	var table strings.Builder
	fmt.Fprintf(&table, "## %d passes per trace (steady state)\n\n", loopPasses)
	fmt.Fprintf(&table, "Passes 2-%d reuse the cache left by the previous pass. Maps and remaps are granules (2 MiB) per pass, averaged over passes 2-%d; fragmentation is over all %d passes.\n\n", loopPasses, loopPasses, loopPasses)
	fmt.Fprintf(&table, "| trace | allocator | pass 1 maps | maps/pass after | remaps/pass after | device allocs/pass after | fragmentation | pass 1 ops/s | later ops/s |\n")
	fmt.Fprintf(&table, "|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, st := range traces {
		tr, err := ReadFile(st.Path)
		require.NoError(t, err)
		ops := float64(2 * len(tr.Events))
		for i, c := range configs {
			var its []Iteration
			withAllocator(t, c.cfg, func(a *allocator.Allocator) {
				its, err = ReplayLoop(a, tr, 0, loopPasses)
				require.NoError(t, err)
			})
			var maps, remaps, devAllocs int64
			var later time.Duration
			for _, it := range its[1:] {
				maps += it.Maps
				remaps += it.Remaps
				devAllocs += it.DeviceAllocs
				later += it.Elapsed
			}
			n := float64(len(its) - 1)
			last := its[len(its)-1]
			frag := 1 - float64(last.PeakAllocated)/float64(last.PeakReserved)
			// Each pass replays every event once: allocations plus frees.
			perPass := float64(len(tr.Events))
			_ = ops
			t.Logf("%-15s %-38s pass1 maps %5d then maps %6.1f remaps %6.1f dev allocs %6.1f per pass, frag %5.2f%%",
				st.Name, c.name, its[0].Maps, float64(maps)/n, float64(remaps)/n, float64(devAllocs)/n, 100*frag)
			fmt.Fprintf(&table, "| %s | %s | %d | %.1f | %.1f | %.1f | %.2f%% | %.0f | %.0f |\n",
				st.Name, c.name, its[0].Maps, float64(maps)/n, float64(remaps)/n, float64(devAllocs)/n, 100*frag,
				perPass/its[0].Elapsed.Seconds(), perPass*n/later.Seconds())
			if i == 0 {
				require.LessOrEqual(t, frag, maxFragmentation, "%s: fragmentation %.2f%% over %d passes", st.Name, 100*frag, loopPasses)
			}
		}
	}
	sections = append(sections, table.String())
}

func header() string {
	return fmt.Sprintf(`# Allocator trace replay

Date: %s. Machine: %d cores, no GPU; device/sim (64 GiB simulated card, 2 MiB granules; memory is really mapped: memfd pages).
Go: %s.

Command (from the repository root):

    go test ./bench/allocbench/ -run 'TestTraceReplay' -count=1 -v -args -allocbench.results=$PWD/bench/results/allocator-trace-replay.md

Every storage allocation and free of the five DTR traces in ../shared/traces/dtr is replayed on
one stream with no limit and no eviction (reader: bench/allocbench/trace.go; 0-byte storages
allocate nothing). Peaks are allocated_bytes.all.peak and reserved_bytes.all.peak.

- fragmentation = 1 - peak allocated / peak reserved (target <= 5%% for the default);
- overhead = 1 - peak requested / peak reserved (also counts rounding inside blocks);
- remapped granules: cached free 2 MiB granules unmapped and mapped where a request needed them;
- ops/s: Malloc and Free calls per second; on sim, growth costs real mmap/memfd system calls
  (one CreatePhysical and one Map per 2 MiB granule), so a first pass that maps 10 GB is
  dominated by them, while later passes run from the cache.

The configurations: the default (expandable segments, CacheSlack 0: once reserved memory
would pass the allocated high-water mark by more than 4 granules, cached free granules are
remapped instead of new ones created); CacheSlack 0.05 (5%% allowance before remapping);
CacheSlack -1 (no remapping below the limit: PyTorch's expandable segments); and Device.Alloc
segments (PyTorch's native 2 MiB / 20 MiB / rounded segments, no VMM). The second table shows
the price of the default's tight bound in a training loop: a few to a few hundred granule
moves per pass (each an Unmap and a Map; on a GPU a cuMemUnmap + cuMemMap + cuMemSetAccess).

`, time.Now().Format("2006-01-02"), runtime.NumCPU(), runtime.Version())
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

// BenchmarkReplay replays each trace through the default allocator: one op
// is one whole pass over the trace; the steady state (cache warm from
// earlier passes) is what is timed.
func BenchmarkReplay(b *testing.B) {
	traces := sharedtraces.ForTest(b)
	for _, st := range traces {
		tr, err := ReadFile(st.Path)
		require.NoError(b, err)
		b.Run(st.Name, func(b *testing.B) {
			withAllocator(b, allocator.Config{}, func(a *allocator.Allocator) {
				if _, err := ReplayLoop(a, tr, 0, 1); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				var busy time.Duration
				for i := 0; i < b.N; i++ {
					res, err := Replay(a, tr, 0)
					if err != nil {
						b.Fatal(err)
					}
					busy += res.Elapsed
				}
				b.StopTimer() // not the teardown
				b.ReportMetric(float64(len(tr.Events))*float64(b.N)/busy.Seconds(), "ops/s")
			})
		})
	}
}
