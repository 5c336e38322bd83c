package autotune

import (
	"errors"
	"fmt"
	"time"

	"github.com/memscale/memscale/evict"
	rc "github.com/memscale/memscale/recompute"
	"github.com/memscale/memscale/replay"
)

// The least budget a step runs at.
//
// The engine's minimum budget (evict.Engine.MinBudget: what is pinned plus
// the largest set of tensors one op or rebuild had resident at once) is a
// lower bound: no budget below it can run the step, but a budget at it may
// still fail where rebuilds nest (a plan holds its inputs), where what
// leaves the step must be resident at once, or where the heuristic's victims
// leave no room. LeastBudget finds a budget that works by replaying the
// step's recorded program with the configuration the step would run with,
// rebuilding as the plugin's region does (replay.Options.Region: inputs in
// argument order, the outer levels of a nested rebuild parked in host
// memory, restarts, room for what leaves the step at once), searching upward
// from the lower bound: the answer is a budget at which a replay finished
// (or the ceiling, a budget the step itself ran at).

// LeastOverheadLimit is the replays' default overhead limit: a budget at
// which the step's compute grows past this factor (rebuilding much of a long
// chain for every tensor it needs) does not count as working.
const LeastOverheadLimit = 10.0

// leastMaxReplays bounds the search.
const leastMaxReplays = 40

// LeastOptions configure LeastBudget.
type LeastOptions struct {
	// Floor is the step's lower bound (the engine's minimum budget); the
	// search starts there.
	Floor uint64
	// Ceiling is a budget known to work (0 = none known): the budget the
	// step ran whole at, or its peak when it ran with nothing evicted.
	Ceiling uint64
	// Engine is the configuration the step runs with (its Budget, Usage and
	// Record are the replay's).
	Engine evict.Config
	// OverheadLimit: a replay past it does not work (0 = LeastOverheadLimit).
	OverheadLimit float64
}

// LeastTry is one replay of the search.
type LeastTry struct {
	Budget   uint64  `json:"budget"`
	Status   string  `json:"status"`
	Overhead float64 `json:"overhead"`
}

// LeastReport is what LeastBudget found.
type LeastReport struct {
	// Budget is the least budget found to work: one a replay finished at,
	// or Ceiling when none below it did (0: none found and no ceiling).
	Budget uint64 `json:"budget"`
	// Threshold is the budget to name: Budget plus Headroom (0 with Budget).
	Threshold uint64 `json:"threshold"`
	// Headroom is the search's precision (1/512 of the floor, at least 4
	// KiB), added to Budget for later steps of the same shapes, whose
	// programs can need a few bytes more than the one replayed (a hidden
	// state carried from the previous step instead of a fresh one).
	Headroom uint64 `json:"headroom"`
	// Fails is the largest budget a replay failed at (0: none failed): with
	// the search's assumption that more memory never hurts, every budget up
	// to it fails.
	Fails uint64 `json:"fails"`
	// Floor is the lower bound the search started at.
	Floor uint64 `json:"floor"`
	// Replayed reports whether a replay finished at Budget (false: Budget is
	// the ceiling the step itself ran at).
	Replayed bool `json:"replayed"`
	// Tries are the replays, in order.
	Tries []LeastTry `json:"tries"`
	// WallNS is the search's wall time.
	WallNS int64 `json:"wall_ns"`
}

// leastPrecision is the search's resolution at lower bound floor: 1/512 of
// it (0.2 %), at least 4 KiB.
func leastPrecision(floor uint64) uint64 { return max(floor/512, 4096) }

// LeastBudget searches for the least budget at which tr runs under
// opt.Engine: a replay at the floor, then at the floor plus a step that
// doubles until one finishes (or the ceiling is reached), then bisection
// down to leastPrecision between the last that failed and the first that
// finished. Each try is a whole replay; the search makes at most 40.
func LeastBudget(tr *rc.Trace, opt LeastOptions) (LeastReport, error) {
	start := time.Now()
	if tr == nil {
		return LeastReport{}, errors.New("autotune: no program to search a budget for")
	}
	limit := opt.OverheadLimit
	if limit == 0 {
		limit = LeastOverheadLimit
	}
	cfg := opt.Engine
	cfg.Usage, cfg.UsagePeak, cfg.OnEvict, cfg.Record = nil, nil, nil, false
	if cfg.Heuristic == evict.Auto {
		cfg.Heuristic = evict.Default // a first step under "auto" scores with the default
	}
	floor := max(opt.Floor, 1)
	rep := LeastReport{Floor: floor}
	works := func(b uint64) (bool, error) {
		res, err := replay.Run(tr, replay.Options{Budget: b, Engine: cfg, OverheadLimit: limit, Plans: true, Region: true})
		if err != nil {
			return false, fmt.Errorf("autotune: replay at %d bytes: %w", b, err)
		}
		rep.Tries = append(rep.Tries, LeastTry{Budget: b, Status: res.Status.String(), Overhead: res.Overhead})
		if !res.Feasible() {
			rep.Fails = max(rep.Fails, b)
		}
		return res.Feasible(), nil
	}
	done := func(good uint64, replayed bool) (LeastReport, error) {
		rep.Budget, rep.Replayed, rep.WallNS = good, replayed, time.Since(start).Nanoseconds()
		if good != 0 {
			rep.Headroom = leastPrecision(floor)
			rep.Threshold = good + rep.Headroom
		}
		return rep, nil
	}
	if opt.Ceiling != 0 && floor >= opt.Ceiling {
		return done(opt.Ceiling, false)
	}
	ok, err := works(floor)
	if err != nil || ok {
		if err != nil {
			return LeastReport{}, err
		}
		return done(floor, true)
	}
	prec := leastPrecision(floor)
	bad, good, replayed := floor, uint64(0), false
	for step := prec; ; step *= 2 {
		b := floor + step
		if b < floor || (opt.Ceiling != 0 && b >= opt.Ceiling) {
			if opt.Ceiling == 0 {
				return done(0, false)
			}
			good = opt.Ceiling
			break
		}
		if len(rep.Tries) >= leastMaxReplays {
			return done(opt.Ceiling, false)
		}
		ok, err := works(b)
		if err != nil {
			return LeastReport{}, err
		}
		if ok {
			good, replayed = b, true
			break
		}
		bad = b
	}
	for good-bad > prec && len(rep.Tries) < leastMaxReplays {
		mid := bad + (good-bad)/2
		ok, err := works(mid)
		if err != nil {
			return LeastReport{}, err
		}
		if ok {
			good, replayed = mid, true
		} else {
			bad = mid
		}
	}
	return done(good, replayed)
}
