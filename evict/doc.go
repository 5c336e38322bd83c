// Package evict is memscale's Dynamic Tensor Rematerialization (DTR) policy:
// the Engine that both the C ABI (memscale_dtr_*, package main in cabi/) and
// the trace replay runtime (package replay) drive. It holds the candidate
// set, the eviction heuristics (h_DTR e*, h_DTR^eq, h_DTR^local, h_MSPS, LRU,
// size, and memscale's anc-sqrt), the candidate index, the budget loop with
// its swap-or-recompute decision, eager eviction and banishing of released
// storages, rematerialization plans and the recording of a step for package
// autotune.
//
// # What it is and is not
//
// The engine decides; it never touches memory. It keeps the books of a
// program (which storages are resident, evicted, swapped out or gone, what
// each would cost to rebuild, how many bytes are in use) and tells its
// caller what to free (a Victim: drop, or copy to host then free) and how
// to bring a tensor back (a plan of re-runs and swap-ins). The caller
// allocates, frees, copies and runs ops, and reports what it did: Call and
// Mutate for the program's ops, Rematerialized and SwappedIn for plan steps.
// The engine does not know addresses, streams or devices; with
// Config.Usage it reads the bytes in use from outside (the allocator's
// count) instead of counting them itself.
//
// The lineage graph - tensors, the storages they live in, the ops that made
// them, plans - is package recompute's (see its doc.go); evict adds the
// policy on top. An Engine is not safe for concurrent use: the C ABI
// serializes the calls on one handle.
//
// # Structures
//
// Engine (engine.go) owns:
//
//   - g, the recompute.Graph. Storages, not tensor names, are the unit of
//     eviction: a view shares its base's storage and goes with it.
//   - clock: 1 plus the cost of every op run, re-run, and modelled swap
//     transfer. Staleness, the time since a storage's LastAccess, is
//     measured on it, so the heuristics are deterministic (wall time never
//     enters a decision).
//   - usage and peak: the bytes of resident storages, and their maximum.
//   - tr, the tracker (tracker.go): a storage's cost, the numerator of its
//     score. localTracker is the storage's own compute (dtr-local, lru,
//     size); regionTracker (regions.go) adds the compute of its evicted
//     neighbourhood, walked on demand - ancestors only (msps, anc-sqrt) or
//     both directions (dtr, e*); eqTracker (eqclass.go) approximates that
//     neighbourhood by union-find classes of evicted storages
//     (recompute.Classes: dtr-eq, dtr-eq-anc). Costs only rise when a
//     storage is evicted or an op recorded; whenever one may fall, the
//     tracker reports the storage to the selector (lowered).
//   - sel, the selector (select.go): the candidate set and the choice of the
//     victim. indexSelector (index.go) is a kinetic tournament tree over the
//     candidates' keys, whose nodes know when their comparison can next flip
//     as the clock advances; scanSelector scans every candidate (exact, the
//     definition; Config.ExactScan) and the property test in index_test.go
//     checks that both choose the same victims over random histories. The
//     engine builds the tree at its first victim search (lazySelector,
//     lazy.go): until then the candidates are a set, so a step that never
//     evicts pays no tree upkeep per op.
//   - key (heuristic.go) is what the selectors compare: a clock-free
//     numerator a = cost^T / size^M (T, M: recomp_time_factor and
//     recomp_memory_factor), the last access l, a tie-break sequence and a
//     "dead" bit. The score at clock T is a/(T-l) for the staleness
//     heuristics (a/sqrt(T-l) for anc-sqrt, compared as a^2/(T-l)) and a for
//     the others; before compares two scores exactly (128-bit products, no
//     rounding). Lower goes first; a dead key goes before every live one.
//   - pending and pendAt: storages the engine took out of memory on its own
//     (eager evictions, banished storages, throw-away copies of a re-run),
//     queued until Evict hands them to the caller (Pending counts them).
//   - plans (planhold.go): committed rematerialization plans not run to the
//     end, innermost last.
//   - soft (planhold.go, softHolds): the soft plan holds. Per storage, the
//     number of reads of it by the re-run steps of the open plans not
//     reported yet, and a stack of entries, one per open plan that reads
//     it (innermost on top), each with that plan's first unreported step
//     that does: the top entry says when the storage is read next.
//   - rec (record.go): with Config.Record, or heuristic Auto, the program as
//     a recompute.Trace (Recording), for package autotune to replay under
//     other configurations; it stops, and says why, at
//     MaxRecordedInstructions or at anything it cannot follow.
//   - finished: set by Finish (see the budget loop).
//   - reclaimGot and shortfall: the bytes an open Reclaim wrote, and why the
//     last Reclaim fell short (see Reclaim).
//   - pinnedReg, pinnedLater and minBudget (floor.go): the bytes of the
//     resident pinned storages, pinned at registration and later, and the
//     step's minimum budget so far (see The step's minimum budget).
//   - flags: per-storage bits (flagRegPin, flagRebuilt, flagQueued), grown
//     only when a bit is set.
//   - stressQ and stressAt (stress.go): with Config.Stress, the storages
//     that became candidates since the last Evict looked.
//
// Config (config.go) is the configuration; Defaults.Decode and Config.JSON
// (configjson.go) are its JSON form, the keys of memscale_dtr_create, with
// the DTR region's defaults ("defaults": "region": RegionEvicteeMinSize,
// the auto policy when there is a budget and no stress).
//
// # The life of a storage
//
// A storage is born resident, with one reference per tensor in it: an
// external tensor (NewTensor; pinned or not, it cannot be recomputed) or
// the output of an op (Call). From then on:
//
//	resident --drop--> evicted --re-run (Rematerialized)--> resident
//	resident --swap--> swapped --copy back (SwappedIn)-----> resident
//	any ----banish/detach---------------------------------> released (for good)
//
// A drop is a budget victim whose rebuild is cheaper than two transfers
// (evictStorage), an eager eviction, or the old version of a storage an
// in-place op overwrote (Mutate: the new version takes over its memory and
// pins). A swap is a budget victim when swapping is on (Config.SwapBandwidth)
// and the round trip is cheaper than recomputing, or the storage cannot be
// recomputed at all. Locks (Lock, plan holds) keep a storage resident for
// now, pins (Pin, NewTensor's pinned) for good; neither is ever a candidate.
// A soft plan hold (a later step of an open plan reads it) keeps a storage
// a candidate, but a reserve one, taken only when no ordinary one is left.
//
// References come from NewTensor and Call (one per tensor), Retain and
// Mutate's new versions, and go with Release. A storage left with no
// references and no locks is "unreferenced" (refs.go, unreferenced):
//
//   - with no budget (and not in simulator or stress mode) nothing will
//     ever be evicted, so nothing needs its lineage: it is detached - freed
//     for good, and its dependents marked not recomputable;
//   - when no live (not released) storage was computed from it, nothing can
//     ever need it: it is banished, and so, in turn, is every parent left
//     with no references, no locks and no live children;
//   - otherwise, if it is resident, unpinned and recomputable, no open plan
//     reads it and its last reference was just released, it is dropped at
//     once (eager eviction): its dependents may still need to rebuild it, so
//     it stays evicted, not released;
//   - otherwise (it was rebuilt only to recompute something else, or it was
//     locked or soft-held when released) it stays resident as a dead
//     candidate, evicted before any referenced storage (once no open plan
//     reads it: until then it is a reserve candidate).
//
// The keep-needed-released rule (needed.go; on unless
// Config.DropNeededReleased or SimulatorCompat): a released storage that an
// evicted, still referenced storage was computed from directly is neither
// dropped eagerly nor dead-ranked; it stays an ordinary candidate until that
// storage comes back, is released or is banished (feedsEvicted,
// notNeeded). Without it, a gradient evicted while its parent was locked
// could lose the parent the moment the program released it, and its
// rebuild would re-run everything the parent came from.
//
// SimulatorCompat reproduces the DTR authors' simulator instead: released
// storages are dropped but never banished, and zero-byte storages are
// candidates.
//
// # The budget loop
//
// Evict(extra, out) (budget.go) is called by the caller before it
// allocates extra bytes (0 to just apply the budget). It
//
//  1. fails at once, evicting nothing, with a *TooLargeError (which matches
//     ErrNoEvictable) when extra alone is larger than a non-zero budget;
//  2. hands out the pending storages (and closes an open Reclaim);
//  3. while usage + extra > budget, picks a victim (pick), takes it out
//     (evictStorage: drop or swap) and writes it to out, until out is full.
//     pick takes the ordinary candidate with the lowest score (dead ones
//     first), and a reserve candidate - a storage that a re-run step of an
//     open plan, not reported yet, reads (soft plan holds, see Rebuilding)
//     - only when no ordinary candidate is left: among those, the one the
//     open plans read last goes first (Belady's rule; then dead ones, then
//     the lowest score), counted in Stats.ReserveEvictions. The two tiers
//     are one order of keys (key.reserve, key.due), so the index and the
//     exact scan need nothing else;
//  4. fails, naming usage, budget and what keeps each resident storage
//     (whyNoneEvictable), only when it is still over the budget, nothing is
//     evictable and it wrote nothing in this call.
//
// When it fails (steps 1 and 4) and the budget is below what the step needs
// at this point - the pinned totals, the bytes of the locked resident
// storages that are not pinned (the running op's inputs, a plan's held
// step) and extra - the error says so first, naming those parts and the
// step's minimum budget so far (floorNow.below), e.g.
//
//	budget 41.0 MiB is below what this step needs at this point: 44.9 MiB
//	pinned at registration (parameters, inputs) + 44.9 MiB pinned later
//	(gradients) + 77.1 MiB locked by the running op + 10.0 MiB requested;
//	the step's minimum budget so far is 170.0 MiB (largest op:
//	native_batch_norm_backward); usage ... > budget ...: nothing
//	evictable (...)
//
// ("(this point)" in place of the largest op when this point needs more
// than any op so far).
//
// A full out means "call again". With an external usage source the victims
// of a call are still counted by it until the caller frees them, so the loop
// subtracts what it evicted in this call. Once the engine is finished
// (Finish: the step is over and the caller is about to make every escaping
// tensor resident) the budget still binds: a run never goes over it before
// raising, and the error of step 1 or 4 then names what leaves the step. A
// failure that is a bound (no open plan) becomes the step's minimum budget
// (noteNeed), so a failed step reports the minimum its error names. EvictOne evicts
// the best victim whatever the budget (a memory model that could not place a
// block although the budget allows it).
//
// # Stress mode
//
// Config.Stress ("stress": true) is a testing setting in which every
// evictable storage is evicted as soon as no running op needs it, so that a
// program exercises rematerialization everywhere at once. The caller calls
// Evict after every op. With stress, Evict ignores the budget and extra:
// after the pending storages it evicts (drop or swap, as the budget loop
// would) every candidate - eligible as always: resident, unlocked,
// unpinned, not too small, recomputable or swappable - that was not
// rematerialized or swapped in during the engine's life, and it never fails.
// A storage rebuilt once (flagRebuilt, set by RematerializedFor and
// SwappedIn) is not evicted again by stress, so each storage is evicted by
// stress at most once and the re-runs stay linear in the program, not
// quadratic. Nor does stress evict a reserve candidate: it evicts what no
// running op and no open plan still needs, so a storage that a later step
// of an open plan reads is evicted once the last such step is reported (or
// the plans are abandoned), when softRelease queues it again. refresh
// queues every storage that becomes a candidate (stressNote; flagQueued
// keeps it in the queue once) and stressEvict takes them in that order,
// skipping those that are no longer candidates, or are reserve ones: an
// Evict with nothing to evict costs nothing. Reclaim and EvictOne still
// choose among all candidates, rebuilt and reserve ones included (reserve
// ones last, as pick does). The unreferenced rule for no budget (detach)
// does not apply: stress needs the lineage.
// Stats reports a budget of 0. The region defaults give a stress engine
// evictee_min_size 0 and the default heuristic (no tuning, no recording).
//
// # The step's minimum budget
//
// The engine tracks a lower bound below which no budget can run the step
// (MinBudget; "min_budget" and "min_budget_parts" in the C ABI's stats):
// the maximum over the ops so far of
//
//	floor = pinned at registration + pinned later + op bytes
//
// where the first two are the bytes of the resident storages pinned by
// NewTensor (parameters, inputs) and by Pin (gradients), and op bytes is
// the bytes of the distinct storages among the op's inputs and outputs that
// those totals do not count - all of them are resident together while the
// op runs. noteFloor evaluates it at every Call (inputs and outputs), Mutate
// (inputs: the new versions live in their memory) and re-run
// (RematerializedFor: inputs and outputs, throw-away copies included), in
// O(inputs + outputs) with a graph mark, allocating nothing; the maximum
// keeps its parts and the op's name. The two pinned totals are counters
// (countPinned after a storage becomes resident or pinned, uncountPinned
// before it stops being either: NewTensor, Pin, Unpin, Mutate's transfer of
// pins, dropStorage, a swap out, banish, a re-run, SwappedIn); a storage's
// pins count as "at registration" (flagRegPin) when they come from
// NewTensor, or from the old version an in-place op's new version took
// them over from, and as "later" when Pin pinned it while it had none.
// It is tracked whatever the budget: an engine with no budget measures it.
//
// # Reclaim
//
// Reclaim(need, out) (reclaim.go) is eviction on demand, for an allocation
// that failed: the allocator's reclaimer (in the library, the host's
// callback, which calls memscale_dtr_reclaim) asks for the bytes it is
// short of. It ignores the budget: it hands out the pending storages, then
// picks and evicts victims exactly as the budget loop does (pick: reserve
// candidates last; evictStorage: drop or swap; counted in Evictions or
// SwapsOut and BytesEvicted, and in ReclaimVictims; OnEvict with
// ReasonReclaim) until the sizes written, the pending ones included, sum
// to at least need, or out is full. A full out leaves the reclaim open: the
// next call counts the bytes already written (reclaimGot) toward the same
// need; a shorter return, and any Evict, closes it. Running out of
// candidates first is not an error: Reclaim returns what it wrote and
// ReclaimShortfall says why nothing more could go (whyNoneEvictable: pins,
// locks, plan holds, minimum size), which the library puts into the
// allocation's out-of-memory error.
//
// # Rebuilding
//
// Plan (remat.go) returns the steps that make a tensor resident, ancestors
// first (recompute.Graph.Plan); it changes nothing. HoldPlan commits a plan
// the caller is about to run, and the engine holds what its steps read in
// two strengths (planhold.go):
//
//   - hard: it locks the inputs of the first re-run step not reported yet,
//     and only those, so an eviction while the plan runs can take anything
//     but what the next step reads (locking every step's inputs at once
//     would need O(plan length) storages where DTR needs one op's);
//   - soft: every storage that a re-run step not reported yet reads - a
//     resident input of a later step, or the output of an earlier step once
//     it is produced - is a reserve candidate until the last step that
//     reads it is reported. Without this, the budget loop took a plan's
//     just-rebuilt intermediates (dead, or stale) and the resident inputs of
//     its later steps as cheap victims, each such step then rebuilt its
//     input with a nested plan, which held its own inputs, and the chain of
//     plans went deep and thrashed.
//
// Rematerialized and SwappedIn report steps; planStepDone moves the lock to
// the next re-run step and takes away the soft holds of the step that ran.
// The caller rebuilds an input that was evicted meanwhile with a plan of its
// own (plans nest; a report advances the innermost plan whose step it is).
// Plans end when their last re-run step is reported; AbandonPlans drops
// every open plan's holds at once for a caller that gives up (nothing else
// drops a plan: Finish, Release and errors leave the open plans as they
// are). The soft holds are kept incrementally, in O(the reads of the step
// or plan involved): the count and the stack entry of each read storage at
// HoldPlan, at each re-run step's report, and at AbandonPlans; a storage
// whose next read moves later, or that stops being soft-held, is re-keyed
// (lowered). An op with no plan open neither scans nor allocates for them.
// A re-run of a multi-output op remakes outputs the program released
// for good: those throw-away copies are queued as pending drops.
//
// # Invariants
//
//   - usage is the sum of the sizes of the resident storages, each storage
//     counted once whatever its views: grow (NewTensor, call, SwappedIn),
//     dropStorage and evictStorage, banish, RematerializedFor and Mutate
//     keep it. peak is at least usage at the end of every call, and also
//     counts the throw-away copies a re-run makes (RematerializedFor); an
//     in-place op's new version, which lives in the old one's memory, does
//     not raise it (Mutate).
//   - The candidate set is exactly the storages eligible allows (resident,
//     unlocked, unpinned, not too small, recomputable or swappable): every
//     change to a storage's state, locks, pins or recomputability is
//     followed by refresh (or by sel.remove, in dropStorage, evictStorage,
//     banish and holdStep).
//   - A key stored in the index never sorts a storage later than its true key
//     does: keys enter as lower bounds (lowKey), whatever can lower a score
//     re-keys the storage eagerly (the trackers' lowered, notNeeded,
//     parentNotNeeded, unreferenced, softRelease), and pick corrects upward
//     only the storage at the root (a storage that became a reserve one, or
//     is read sooner, by HoldPlan, is corrected there). So the index
//     returns the victim the exact scan would.
//   - Every unfinished plan holds one lock on each input of exactly one
//     step, its first re-run step not reported yet (holdStep,
//     planStepDone); a plan whose steps are all reported holds nothing and is
//     forgotten.
//   - soft.count[s] is the number of reads of s by the re-run steps of the
//     open plans from their held step on, and s's stack has one entry per
//     open plan among them, innermost on top, with the plan's first such
//     step (checked against a scan of the plans by the property tests); a
//     candidate's key is a reserve key exactly when the count is positive.
//   - pending[pendAt:] are the victims not handed out yet, in the order
//     they left memory (queue, Evict); none is resident (a re-run or a
//     swap-in takes a storage that comes back out of it: unqueueResident).
//   - pinnedReg + pinnedLater is the sum of the sizes of the resident
//     storages with Pins > 0, each in the total flagRegPin says; small is
//     that of the resident storages with Pins == 0 and 0 < Size <
//     EvicteeMinSize (countPinned / uncountPinned around every change).
//   - With Config.Stress, every candidate that is not flagRebuilt and not
//     soft-held is in stressQ[stressAt:] (flagQueued).
//   - A storage's Refs is the sum of its tensors' Refs (Retain, release),
//     and its LiveChildren counts its children that are not released
//     (recompute.Graph.AddOp adds them, banish takes them away).
//
// # Parking
//
// With Config.Park, two things that would otherwise make
// rebuilds nest until nothing is evictable copy to host memory instead
// (counted in Stats.Parked and SwapsOut):
//
//   - evictStorage swaps a reserve victim (soft-held: a later step of an
//     open plan reads it) instead of dropping it, whatever SwapBandwidth
//     says: dropped, it would be rebuilt by a plan nested in the one that
//     reads it, which re-runs what it came from;
//   - Park (park.go) swaps out a storage although it is locked, for a
//     caller whose innermost rebuild found nothing evictable: the storages
//     the outer levels of the rebuild hold are not read until it is done.
//     The locks stay; the holder checks residency before it reads them and
//     has them swapped back (Plan gives a swap-in step).
//
// Both respect OffloadLimit. The caller keeps the levels (which storages
// each open level reads) and chooses what to park, outermost first.
//
// # Files
//
//	doc.go        this overview
//	engine.go     Engine, New, Action, Victim, errors, Stats, accessors
//	config.go     Config, EvictReason, UsageSource, Defaults and the region defaults
//	configjson.go DecodeConfig, Defaults.Decode, Config.JSON
//	ops.go        NewTensor, Call, Mutate, Access
//	refs.go       Lock, Unlock, Pin, Unpin, Retain, Release; unreferenced,
//	              detach, banish and the pending queue
//	budget.go     Evict, Finish, EvictOne, victim choice and eviction,
//	              eligibility, keys and Score
//	stress.go     stress mode: the queue of candidates and stressEvict
//	floor.go      the step's minimum budget, the pinned totals, the
//	              per-storage flags and the error text of a budget below
//	              what the step needs
//	reclaim.go    Reclaim, ReclaimShortfall, handing out the pending queue
//	remat.go      Plan, Rematerialized, SwappedIn
//	planhold.go   HoldPlan, the plan holds (hard and soft), AbandonPlans
//	park.go       Park: a locked storage swapped out for a nested rebuild
//	needed.go     the keep-needed-released rule, and why nothing is evictable
//	heuristic.go  Heuristic, ParseHeuristic, key, exact score comparison
//	tracker.go    the tracker interface and localTracker
//	regions.go    regionTracker (evicted-neighbourhood walks)
//	eqclass.go    eqTracker (union-find classes)
//	select.go     the selector interface and scanSelector
//	index.go      indexSelector (the kinetic tournament tree)
//	lazy.go       lazySelector (the tree built at the first pick)
//	record.go     the recorder and Recording
package evict
