"""A small pure-Python stand-in for the Go DTR engine (tests only).

It follows the semantics of ``evict/engine.go`` and ``recompute/graph.go``
(storages with refs/locks/pins, eager eviction and banishing of released
storages, Mutate taking over the old memory, plans ancestors first, victims
handed out by ``evict``), with the ``h_DTR^local`` score. It exists so the
region's mechanics can be tested when ``libmemscale.so`` lacks the engine; the
end-to-end tests run against the real library. Functions take the same
arguments as the C ABI (ctypes arrays for pointers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

RESIDENT, EVICTED, SWAPPED, RELEASED = range(4)


@dataclass
class _T:
    op: int
    alias: int
    storage: int
    defined: bool = True
    refs: int = 1


@dataclass
class _S:
    root: int
    size: int
    tensors: list[int] = field(default_factory=list)
    state: int = RESIDENT
    locks: int = 0
    pins: int = 0
    refs: int = 0
    last: int = 0
    compute: int = 0
    norecompute: bool = False
    children: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    live_children: int = 0


@dataclass
class _O:
    name: str
    inputs: list[int]
    outputs: list[int]
    cost: int
    flags: int


class _Engine:
    def __init__(self, cfg: dict) -> None:
        self.budget = int(cfg.get("budget") or 0)
        self.swap_bw = float(cfg.get("swap_bandwidth") or 0)
        self.min_size = int(cfg.get("evictee_min_size") or 0)
        self.t: list[_T] = []
        self.s: list[_S] = []
        self.o: list[_O] = []
        self.clock = 1
        self.usage = 0
        self.peak = 0
        self.pending: list[tuple[int, int]] = []
        self.st = dict.fromkeys(
            ["evictions", "eager_evictions", "banished", "rematerializations", "swaps_out", "swaps_in",
             "base_cost_ns", "remat_cost_ns"], 0)

    def grow(self, n: int) -> None:
        self.usage += n
        self.peak = max(self.peak, self.usage)

    def resident(self, t: int) -> bool:
        x = self.t[t]
        return x.defined and self.s[x.storage].state == RESIDENT

    def external(self, nbytes: int, pinned: bool) -> int:
        tid = len(self.t)
        sid = len(self.s)
        self.s.append(_S(root=tid, size=nbytes, tensors=[tid], refs=1, last=self.clock, norecompute=True,
                         pins=1 if pinned else 0))
        self.t.append(_T(op=-1, alias=-1, storage=sid))
        self.grow(nbytes)
        return tid

    def call(self, name: str, inputs: list[int], outs: list[tuple[int, int]], cost: int, flags: int) -> tuple[int, list[int]]:
        for i, x in enumerate(inputs):
            if not (0 <= x < len(self.t)):
                raise ValueError(f"op {name} input {i}: unknown tensor {x}")
            if not self.resident(x):
                raise ValueError(f"op {name} input {i}: tensor {x} is not resident")
        start = self.clock
        self.clock += cost
        self.st["base_cost_ns"] += cost
        oid = len(self.o)
        ids = []
        fresh = 0
        seen = set()
        for size, alias in outs:
            tid = len(self.t)
            if alias < 0:
                sid = len(self.s)
                self.s.append(_S(root=tid, size=size, last=self.clock, norecompute=bool(flags & 1)))
                fresh += size
            else:
                sid = self.t[inputs[alias]].storage
            st = self.s[sid]
            st.tensors.append(tid)
            st.refs += 1
            if sid not in seen:
                seen.add(sid)
                st.compute += cost
            self.t.append(_T(op=oid, alias=alias, storage=sid))
            ids.append(tid)
        for x in inputs:
            self.s[self.t[x].storage].last = start
        self.o.append(_O(name, list(inputs), ids, cost, flags))
        ins = {self.t[x].storage for x in inputs}
        outs_s = {self.t[x].storage for x in ids}
        for p in ins:
            for c in outs_s:
                if c != p:
                    self.s[p].children.append(c)
                    self.s[p].live_children += 1
                    self.s[c].parents.append(p)
        self.grow(fresh)
        return oid, ids

    def mutate(self, name, inputs, mutated, cost, flags):
        outs = [(self.s[self.t[inputs[m]].storage].size, -1) for m in mutated]
        if len(set(mutated)) != len(mutated):
            raise ValueError(f"mutate {name}: index listed twice")
        peak = self.peak
        oid, ids = self.call(name, inputs, outs, cost, flags)
        for m, nid in zip(mutated, ids):
            old = self.s[self.t[inputs[m]].storage]
            new = self.s[self.t[nid].storage]
            new.pins, old.pins = new.pins + old.pins, 0
            if old.state == RESIDENT:
                self.drop(self.t[inputs[m]].storage)
        self.peak = max(peak, self.usage)
        for m in mutated:
            self.release(inputs[m])
        return oid, ids

    def drop(self, sid: int) -> None:
        st = self.s[sid]
        st.state = EVICTED
        for x in st.tensors:
            self.t[x].defined = False
        self.usage -= st.size

    def release(self, t: int) -> None:
        x = self.t[t]
        if x.refs <= 0:
            raise ValueError(f"release: tensor {t} has no references left")
        x.refs -= 1
        st = self.s[x.storage]
        st.refs -= 1
        if st.refs == 0 and st.locks == 0:
            self.unreferenced(x.storage)

    def unreferenced(self, sid: int) -> None:
        st = self.s[sid]
        if st.state == RELEASED:
            return
        if self.budget == 0 or st.live_children == 0:
            if self.budget == 0:
                for c in st.children:
                    self.s[c].norecompute = True
            self.banish(sid)
        elif st.state == RESIDENT and st.pins == 0 and not st.norecompute:
            self.drop(sid)
            self.st["eager_evictions"] += 1
            self.pending.append((st.root, 0))

    def banish(self, sid: int) -> None:
        work = [sid]
        while work:
            s = work.pop()
            st = self.s[s]
            if st.state == RELEASED:
                continue
            if st.state == RESIDENT:
                self.usage -= st.size
            if st.state in (RESIDENT, SWAPPED):
                self.pending.append((st.root, 0))
            st.state = RELEASED
            for x in st.tensors:
                self.t[x].defined = False
            self.st["banished"] += 1
            for p in st.parents:
                ps = self.s[p]
                ps.live_children -= 1
                if ps.live_children == 0 and ps.refs == 0 and ps.locks == 0 and ps.state != RELEASED:
                    work.append(p)

    def eligible(self, st: _S) -> bool:
        return (st.state == RESIDENT and st.locks == 0 and st.pins == 0 and st.size > 0
                and st.size >= self.min_size and (not st.norecompute or self.swap_bw > 0))

    def evict(self, cap: int) -> list[tuple[int, int]]:
        out = []
        while self.pending and len(out) < cap:
            out.append(self.pending.pop(0))
        if self.budget == 0:
            return out
        while len(out) < cap and self.usage > self.budget:
            best = None
            for sid, st in enumerate(self.s):
                if self.eligible(st):
                    score = (st.compute + 1) / (st.size * (self.clock - st.last + 1))
                    if best is None or score < best[0]:
                        best = (score, sid)
            if best is None:
                if out:
                    break
                res = [st for st in self.s if st.state == RESIDENT]
                locked = sum(st.size for st in res if st.locks)
                pinned = sum(st.size for st in res if st.pins)
                norec = sum(st.size for st in res if st.norecompute and not st.pins)
                small = sum(st.size for st in res if st.size < self.min_size)
                raise ValueError(
                    f"usage {self.usage} > budget {self.budget}: nothing evictable "
                    f"(locked {locked}, pinned {pinned}, not recomputable {norec}, small {small})")
            st = self.s[best[1]]
            if self.swap_bw > 0 and (st.norecompute or 2 * st.size / self.swap_bw * 1e9 < st.compute):
                st.state = SWAPPED
                self.usage -= st.size
                self.st["swaps_out"] += 1
                out.append((st.root, 1))
            else:
                self.drop(best[1])
                self.st["evictions"] += 1
                out.append((st.root, 0))
        return out

    def plan(self, t: int) -> list[tuple[int, int]]:
        steps: list[tuple[int, int]] = []
        planned_ops: set[int] = set()
        swapping: set[int] = set()

        def ok(x: int) -> bool:
            tx = self.t[x]
            st = self.s[tx.storage]
            if tx.defined and (st.state == RESIDENT or (st.state == SWAPPED and tx.storage in swapping)):
                return True
            return tx.op in planned_ops

        def need(x: int) -> None:
            tx = self.t[x]
            st = self.s[tx.storage]
            if tx.defined and st.state == SWAPPED:
                swapping.add(tx.storage)
                steps.append((1, st.root))
                return
            if st.state == RELEASED:
                raise ValueError(f"tensor {x}: storage released")
            if tx.op < 0 or self.o[tx.op].flags & 1 or (tx.alias < 0 and st.norecompute):
                raise ValueError(f"tensor {x}: cannot be rematerialized")
            for y in self.o[tx.op].inputs:
                if not ok(y):
                    need(y)
            planned_ops.add(tx.op)
            steps.append((0, tx.op))

        if not ok(t):
            need(t)
        return steps

    def rematerialized(self, oid: int, cost: int) -> None:
        op = self.o[oid]
        for x in op.inputs:
            if not self.resident(x):
                raise ValueError(f"re-run of op {oid} ({op.name}): input {x} not resident")
        for x in op.outputs:
            if self.s[self.t[x].storage].state == RELEASED:
                raise ValueError(f"re-run of op {oid} ({op.name}): output tensor {x} was released")
        added = dup = 0
        for x in op.outputs:
            tx = self.t[x]
            st = self.s[tx.storage]
            if tx.alias < 0:
                if st.state == RESIDENT and tx.defined:
                    dup += st.size
                elif st.state != RESIDENT:
                    st.state = RESIDENT
                    added += st.size
            tx.defined = True
        for x in op.inputs + op.outputs:
            self.s[self.t[x].storage].last = self.clock
        if cost < 0:
            cost = op.cost
        self.clock += cost
        self.st["remat_cost_ns"] += cost
        self.st["rematerializations"] += 1
        self.peak = max(self.peak, self.usage + added + dup)
        self.usage += added

    def swapped_in(self, t: int) -> None:
        st = self.s[self.t[t].storage]
        if st.state != SWAPPED:
            raise ValueError(f"swapped in: storage of tensor {t} is not swapped")
        st.state = RESIDENT
        self.grow(st.size)
        self.st["swaps_in"] += 1

    def stats(self) -> dict:
        d = dict(self.st)
        d.update(usage=self.usage, peak_usage=self.peak, budget=self.budget, tensors=len(self.t),
                 storages=len(self.s), ops=len(self.o))
        return d


class FakeFunctions:
    """Drop-in for :class:`memscale._engine.Functions` backed by :class:`_Engine`."""

    def __init__(self) -> None:
        self.engines: dict[int, _Engine] = {}
        self.next = 1
        self.error = ""

    def _guard(self, fn, *args):
        try:
            r = fn(*args)
            return 0 if r is None else r
        except (ValueError, KeyError, IndexError) as exc:
            self.error = str(exc)
            return -1

    def create(self, payload: bytes) -> int:
        cfg = json.loads(payload)
        h = self.next
        self.next += 1
        self.engines[h] = _Engine(cfg)
        return h

    def destroy(self, h: int) -> int:
        self.engines.pop(h, None)
        return 0

    def set_budget(self, h: int, b: int) -> int:
        self.engines[h].budget = int(b)
        return 0

    def tensor(self, h: int, nbytes: int, pinned: int) -> int:
        return self.engines[h].external(int(nbytes), bool(pinned))

    def call(self, h, name, ins, n_in, sizes, alias, n_out, cost, flags, out_ids) -> int:
        e = self.engines[h]

        def go():
            oid, ids = e.call(name.decode(), [ins[i] for i in range(n_in)],
                              [(sizes[i], alias[i]) for i in range(n_out)], int(cost), int(flags))
            for i, x in enumerate(ids):
                out_ids[i] = x
            return oid
        return self._guard(go)

    def mutate(self, h, name, ins, n_in, mut, n_mut, cost, flags, out_ids) -> int:
        e = self.engines[h]

        def go():
            oid, ids = e.mutate(name.decode(), [ins[i] for i in range(n_in)], [mut[i] for i in range(n_mut)],
                                int(cost), int(flags))
            for i, x in enumerate(ids):
                out_ids[i] = x
            return oid
        return self._guard(go)

    def access(self, h, t):
        return 0

    def lock(self, h, t):
        e = self.engines[h]
        e.s[e.t[t].storage].locks += 1
        return 0

    def unlock(self, h, t):
        e = self.engines[h]
        st = e.s[e.t[t].storage]
        if st.locks <= 0:
            self.error = f"unlock: tensor {t} not locked"
            return -1
        st.locks -= 1
        if st.locks == 0 and st.refs == 0:
            e.unreferenced(e.t[t].storage)
        return 0

    def pin(self, h, t):
        e = self.engines[h]
        e.s[e.t[t].storage].pins += 1
        return 0

    def release(self, h, t):
        return self._guard(self.engines[h].release, t)

    def evict(self, h, ids, acts, cap):
        e = self.engines[h]

        def go():
            out = e.evict(cap)
            for i, (x, a) in enumerate(out):
                ids[i] = x
                acts[i] = a
            return len(out)
        return self._guard(go)

    def plan(self, h, t, kinds, ids, cap):
        e = self.engines[h]

        def go():
            steps = e.plan(t)
            if len(steps) > cap:
                raise ValueError(f"plan needs {len(steps)} entries")
            for i, (k, x) in enumerate(steps):
                kinds[i] = k
                ids[i] = x
            return len(steps)
        return self._guard(go)

    def rematerialized(self, h, op, cost):
        return self._guard(self.engines[h].rematerialized, op, cost)

    def swapped_in(self, h, t):
        return self._guard(self.engines[h].swapped_in, t)

    def stats_json(self, h):
        return json.dumps(self.engines[h].stats())
