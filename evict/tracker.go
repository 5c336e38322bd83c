package evict

import (
	rc "github.com/memscale/memscale/recompute"
)

// A tracker maintains what a heuristic needs to know about evicted
// neighbourhoods and returns a storage's cost: the numerator of its score
// before the recomp_time_factor exponent. The engine calls the hooks after
// changing the graph. Whenever a storage's cost may have gone down, the
// tracker calls lowered with it, or, where finding those storages would cost
// a walk, fell: some costs may have fallen, which ones is not said (the
// candidate index keeps keys that are lower bounds of the true ones, so
// increases need no notice).
type tracker interface {
	cost(s rc.StorageID) int64
	// bound returns a lower bound of cost(s) that is cheap to compute
	// (cost itself where that is cheap).
	bound(s rc.StorageID) int64
	// added: op o was recorded; its outputs are resident.
	added(o rc.OpID)
	// dropped: s went from resident to evicted.
	dropped(s rc.StorageID)
	// resident: the storages came back from evicted (an op re-ran).
	resident(ss []rc.StorageID)
	// released: s is gone for good; prev is its state before.
	released(s rc.StorageID, prev rc.State)
	// setLowered installs the decrease notifications: lowered for one
	// storage, fell for costs that may have fallen anywhere.
	setLowered(lowered func(rc.StorageID), fell func())
}

// evicted reports whether a storage counts as evicted for the neighbourhood
// heuristics (swapped storages come back by a copy, not by recomputation, so
// they are treated as present; released ones are not part of the graph any
// more).
func isEvicted(st *rc.Storage) bool { return st.State == rc.Evicted }

func isMaterial(st *rc.Storage) bool {
	return st.State == rc.Resident || st.State == rc.Swapped
}

// localTracker is the cost of the storage alone (h_DTR^local, LRU, size).
type localTracker struct{ g *rc.Graph }

func (t *localTracker) cost(s rc.StorageID) int64             { return t.g.Storage(s).Compute }
func (t *localTracker) bound(s rc.StorageID) int64            { return t.cost(s) }
func (t *localTracker) added(rc.OpID)                         {}
func (t *localTracker) dropped(rc.StorageID)                  {}
func (t *localTracker) resident([]rc.StorageID)               {}
func (t *localTracker) released(rc.StorageID, rc.State)       {}
func (t *localTracker) setLowered(func(rc.StorageID), func()) {}
func newLocalTracker(g *rc.Graph) *localTracker               { return &localTracker{g: g} }

var _ tracker = (*localTracker)(nil)
