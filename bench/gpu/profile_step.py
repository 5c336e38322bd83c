"""Where a GPT-2 step under a DTR region spends its time on a GPU.

One process, the memscale allocator installed. The same model (gpt2_dtr.py's
``Trainer``, its model arguments) trains:

* ``plain``: no region (the memscale allocator only);
* ``record-native`` / ``card-native`` / ``budget-native`` (first: issue 28's
  native region has priority when time is short): as ``record``, ``card`` and
  ``budget`` below on the native region's C++ per-op path
  (``MEMSCALE_NATIVE=1``; the torch extension is built or loaded at the
  first; when it cannot be used these variants are reported unavailable with
  the reason, and the rest run). One step of each ``--trace`` variant
  (``budget-native`` by default) runs under ``torch.profiler`` (CPU and CUDA
  activity): its chrome trace is written gzipped next to the JSON
  (``profile_step_trace_VARIANT.json.gz``) and its top ops by own CPU time
  are printed; every variant below runs with ``MEMSCALE_NATIVE=0``;
* ``record``: inside ``memscale.dtr(None)``: every op recorded, nothing evicted
  (the region's bookkeeping alone);
* ``card``: inside ``memscale.dtr()`` with no threshold set: the budget is the
  device's memory (issue 13's "threshold = card size": within 3 % of plain is
  the goal);
* ``wrap-card``: ``memscale.wrap(model, Config(threshold="100%"))``, the drop-in
  API at the card's size: after two tracked steps that fit, steps of the same
  shapes run untracked (``memscale._dropin.fitting``);
* ``budget``: inside ``memscale.dtr(F x plain peak)`` (``--fraction``, 0.5);
* ``budget-one-call``: as ``budget``, one engine call per op
  (``MEMSCALE_OP_BATCH=1``) instead of one per batch of 32;
* ``budget-host-timer``: as ``budget``, with op costs taken from the host
  clock instead of CUDA events (does the per-op event pair cost?);
* ``blocks-card`` / ``blocks-50`` / ``blocks-min``: ``memscale.blocks(model,
  budget)``, block-level DTR (no per-op interception), at the card's memory
  (bounding the allocated bytes: nothing evicted, the hooks' own cost), at half
  the blocks' activations and at one block's (the least that works), with the
  peak allocated;
* ``checkpointing``: Hugging Face gradient checkpointing (the memory reference
  block-level DTR is compared with; Hugging Face models only);
* ``blocks-at-checkpointing`` (CUDA only): ``memscale.blocks`` bounding the
  device's allocated bytes at checkpointing's peak allocated (equal memory).

For each: the median step time (synchronized), the ratio to ``plain``, the
main thread's CPU time per step while the step is issued (the final
synchronization excluded) and the region's synchronizations per step, then a
cProfile of one step of each region variant: the top functions by own time.
Writes ``profile_step.json`` into ``--out`` when given. ``--time-budget``:
variants that would start after that many seconds are skipped (the native ones
run first).

    PYTHONPATH=pytorch_plugin python bench/gpu/profile_step.py [--batch 8] [--seq 1024] [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import gzip
import io
import os
import pstats
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import _common

_common.setup_env()
import gpt2_dtr  # noqa: E402  (after setup_env: it puts the plugin on sys.path)


def _median_steps(tr: Any, first: int, n: int) -> float:
    for i in range(first, first + n):
        tr.step(i)
    m = _common.median(tr.times[-n:])
    assert m is not None
    return m


def _trace(tr: Any, i: int, out: str | None, name: str, max_mb: float, cuda: bool) -> tuple[dict[str, Any], str]:
    """One step under torch.profiler: (where its gzipped chrome trace went, the
    top ops by own CPU time). The trace is kept only with ``--out`` and when
    no larger than ``max_mb`` gzipped."""
    from torch.profiler import ProfilerActivity, profile

    info: dict[str, Any] = {}
    try:
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts, record_shapes=False, profile_memory=False, with_stack=False) as prof:
            tr.step(i)
        info["step_s"] = round(tr.times[-1], 5)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            raw = Path(out) / f"profile_step_trace_{name}.json"
            prof.export_chrome_trace(str(raw))
            gz = raw.with_name(raw.name + ".gz")
            with open(raw, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            info.update(raw_bytes=raw.stat().st_size, gz_bytes=gz.stat().st_size)
            raw.unlink()
            if gz.stat().st_size > max_mb * (1 << 20):
                gz.unlink()
                info["file"] = None
                info["dropped"] = f"{info['gz_bytes']} bytes gzipped > --trace-max-mb {max_mb}"
            else:
                info["file"] = gz.name
        else:
            info["file"] = None
            info["dropped"] = "no --out"
        return info, table
    except Exception as exc:  # noqa: BLE001 - the numbers above stand without it
        info["error"] = f"{type(exc).__name__}: {str(exc)[:1000]}"
        return info, f"(torch.profiler failed: {info['error']})"


def _profile(tr: Any, i: int, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    tr.step(i)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512, help="sequence length (issue 13 asks for 1024)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per variant (after 2 warm-up steps)")
    p.add_argument("--fraction", type=float, default=0.5)
    p.add_argument("--top", type=int, default=22, help="functions listed per profile")
    p.add_argument("--out", default=None)
    p.add_argument("--device", default="cuda", help="cpu: a tiny model, to test the script without a GPU")
    p.add_argument("--trace", default="budget-native", help="native variants traced with torch.profiler, "
                   "comma-separated (default budget-native; '' for none)")
    p.add_argument("--trace-max-mb", type=float, default=8.0, help="a gzipped trace larger than this is not kept")
    p.add_argument("--native-ext-json", default=None, help="native_ext.py's result: when it says the extension is "
                   "unavailable, the native variants are not tried (no second build)")
    p.add_argument("--time-budget", type=float, default=0.0, help="skip variants that would start after this many "
                   "seconds (0: no limit)")
    a = p.parse_args(argv)
    cuda = a.device == "cuda"
    ok, why = _common.cuda_status()
    if cuda and not ok:
        print(f"SKIP profile_step: {why}")
        return 0
    import memscale
    from memscale._native import crossing as _crossing
    from memscale._region import dispatch

    if cuda:
        memscale.install(backend="cuda")
    import torch

    tiny = [] if cuda else ["--layers", "2", "--width", "64", "--heads", "2", "--seq", "32", "--vocab", "128"]
    seq = [] if not cuda else ["--seq", str(a.seq)]
    margs = gpt2_dtr.parse_args(["--batch", str(a.batch), "--device", a.device, "--steps", str(a.steps), *seq, *tiny])
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    result: dict[str, Any] = {"batch": a.batch, "seq": a.seq if cuda else 32, "device": device, "torch": torch.__version__}
    result["crossing_extension"] = _crossing.unavailable_reason() or "used"
    print(f"crossing extension: {result['crossing_extension']}", flush=True)
    t_start = time.monotonic()
    skipped: list[str] = []

    def out_of_time(name: str) -> bool:
        if a.time_budget and time.monotonic() - t_start > a.time_budget:
            skipped.append(name)
            print(f"{name}: skipped (time budget of {a.time_budget:.0f} s used up)", flush=True)
            return True
        return False

    tr = gpt2_dtr.Trainer(margs, a.batch)
    cpu: dict[str, Any] = {}

    def cpu_of(name: str, n: int) -> None:
        """Medians of the last ``n`` steps' CPU times while issued (main thread, process)."""
        cpu[name] = {"thread": _common.median(tr.thread_cpu[-n:]), "process": _common.median(tr.process_cpu[-n:]),
                     "issue": _common.median(tr.issue_times[-n:])}

    if cuda:
        memscale.reset_peak_memory_stats(0)
    plain = _median_steps(tr, 0, 2 + a.steps)
    cpu_of("plain", a.steps)
    if cuda:
        peak = int(memscale.max_memory_allocated(0))
    else:  # the engine's count of an unbudgeted step
        tr.region = memscale.dtr(None)
        tr.step(0)
        peak = int(tr.region.summary()["peak_usage"])
    budget = int(peak * a.fraction)
    times: dict[str, float] = {"plain": plain}
    profiles: dict[str, str] = {}
    summaries: dict[str, Any] = {}
    syncs: dict[str, float] = {}
    real_timer = dispatch.CudaTimer

    def measure(name: str) -> None:
        """A region's steps after the warm-up: median time, CPU, profile, summary, synchronizations."""
        times[name] = _median_steps(tr, 2, a.steps)
        cpu_of(name, a.steps)
        profiles[name] = _profile(tr, 0, a.top)
        summaries[name] = {k: v for k, v in tr.region.summary().items() if isinstance(v, (int, float, str))}
        syncs[name] = summaries[name].get("synchronizations", 0) / max(1, summaries[name].get("entries", 1))

    class HostTimer:
        """CudaTimer's interface, host time only."""

        def start(self, func: Any) -> None:
            return None

        def stop(self, key: Any, start: Any, host_ns: int) -> int:
            return host_ns

    card = memscale.THRESHOLD if cuda else None  # the device's memory when no threshold is set
    # The native region (issue 28) first.
    native_reason = None
    ne = _common.read_json(a.native_ext_json) if a.native_ext_json else None
    if isinstance(ne, dict) and ne.get("status") == "unavailable":
        native_reason = f"native_ext.py: {ne.get('reason')}"
    traces = {t.strip() for t in a.trace.split(",") if t.strip()}
    trace_info: dict[str, Any] = {}
    trace_tables: dict[str, str] = {}
    native_status: dict[str, str] = {}
    os.environ["MEMSCALE_NATIVE"] = "1"
    for name, b in (("record-native", None), ("card-native", card), ("budget-native", budget)):
        if native_reason is not None:
            native_status[name] = f"unavailable: {native_reason}"
            continue
        if out_of_time(name):
            continue
        tr.region = memscale.dtr(b)
        try:
            _median_steps(tr, 0, 2)  # warm-up (the extension built or loaded at the first entry)
        except memscale.MemscaleError as exc:
            from memscale._native import region_ext

            native_reason = region_ext.unavailable_reason() or str(exc)
            native_status[name] = f"unavailable: {native_reason}"
            print(f"{name}: UNAVAILABLE: {native_reason}", flush=True)
            tr.region = None
            continue
        if not tr.region.native:
            native_status[name] = "failed: the entries ran on the Python region"
            print(f"{name}: FAIL: MEMSCALE_NATIVE=1 but the entries ran on the Python region", flush=True)
            continue
        native_status[name] = "ok"
        measure(name)
        print(f"{name}: median {times[name]:.4f} s ({times[name] / plain:.2f}x plain), main thread CPU "
              f"{cpu[name]['thread']:.4f} s per step (plain {cpu['plain']['thread']:.4f}), budget "
              f"{summaries[name].get('budget')}, {summaries[name].get('evictions')} evictions in all", flush=True)
        if name in traces:
            trace_info[name], trace_tables[name] = _trace(tr, 1, a.out, name, a.trace_max_mb, cuda)
            print(f"{name}: torch.profiler trace of one step: {trace_info[name]} (its table at the end)", flush=True)
    tr.region = None
    os.environ["MEMSCALE_NATIVE"] = "0"  # the Python region from here on
    result["native_region_extension"] = native_reason or "used"
    result["native_status"] = native_status
    variants = [
        ("record", None, real_timer, None),
        ("card", card, real_timer, None),
        ("budget", budget, real_timer, None),
        ("budget-one-call", budget, real_timer, "1"),
        ("budget-host-timer", budget, HostTimer, None),
    ]
    for name, b, timer, batch in variants:
        if out_of_time(name):
            continue
        dispatch.CudaTimer = timer  # type: ignore[misc]
        if batch is None:
            os.environ.pop("MEMSCALE_OP_BATCH", None)
        else:
            os.environ["MEMSCALE_OP_BATCH"] = batch
        tr.region = memscale.dtr(b)
        _median_steps(tr, 0, 2)  # warm-up (and the region's tuning entry)
        measure(name)
        print(f"{name}: median {times[name]:.4f} s ({times[name] / plain:.2f}x plain), "
              f"budget {summaries[name].get('budget')}, {syncs[name]:.1f} synchronizations per step", flush=True)
    dispatch.CudaTimer = real_timer  # type: ignore[misc]
    os.environ.pop("MEMSCALE_OP_BATCH", None)
    # The drop-in API at the card's size (on the CPU: far above the step's peak).
    tr.region = None
    if not out_of_time("wrap-card"):
        memscale.wrap(tr.model, memscale.Config(threshold="100%" if cuda else "1TiB", log_summary=False))
        _median_steps(tr, 0, 2)  # the two tracked steps
        times["wrap-card"] = _median_steps(tr, 2, a.steps)
        cpu_of("wrap-card", a.steps)
        profiles["wrap-card"] = _profile(tr, 0, a.top)
        summaries["wrap-card"] = {
            k: v for k, v in memscale.summary(tr.model).as_dict().items() if isinstance(v, (int, float, str))
        }
        memscale.detach(tr.model)
        syncs["wrap-card"] = 0.0  # untracked steps run no region
        print(f"wrap-card: median {times['wrap-card']:.4f} s ({times['wrap-card'] / plain:.2f}x plain), "
              f"{summaries['wrap-card'].get('untracked_steps')} of {summaries['wrap-card'].get('steps')} steps untracked",
              flush=True)
    # Block-level DTR (memscale.blocks: no per-op interception) at 50 % and 25 %
    # of the blocks' activations, and activation checkpointing for reference.
    peaks: dict[str, int | None] = {}
    least = 0
    for name in ("blocks-card", "blocks-50", "blocks-min"):
        # blocks-card: the card's memory as a bound of the allocated bytes
        # (nothing evicted: the hooks' own cost, issue 13's "within 3 %");
        # blocks-min: one block's activations, the least that works (every
        # block but the last recomputed: checkpointing's memory, about)
        if out_of_time(name):
            continue
        if name == "blocks-card":
            from memscale._blocks.tracker import device_allocated

            card_bytes = torch.cuda.get_device_properties(0).total_memory if cuda else None
            tracker = (memscale.blocks(tr.model, card_bytes, allocated=device_allocated(0)) if cuda
                       else memscale.blocks(tr.model, "100%"))
        else:
            tracker = memscale.blocks(tr.model, "50%" if name == "blocks-50" else least)
        _median_steps(tr, 0, 2)  # the first measures the blocks' activations
        if cuda:
            memscale.reset_peak_memory_stats(0)
        times[name] = _median_steps(tr, 2, a.steps)
        cpu_of(name, a.steps)
        peaks[name] = int(memscale.max_memory_allocated(0)) if cuda else None
        if name == "blocks-min":
            profiles[name] = _profile(tr, a.steps + 2, a.top)
        summaries[name] = tracker.summary()
        if name == "blocks-50":
            least = int(summaries[name]["largest_block"])
        tracker.detach()
        syncs[name] = 0.0  # nothing per op; a recompute runs the block's own ops
        print(f"{name}: median {times[name]:.4f} s ({times[name] / plain:.2f}x plain), peak allocated "
              f"{_common.fmt_bytes(peaks[name]) if peaks[name] else '-'}, {summaries[name]['rematerializations']} "
              f"block recomputes in {summaries[name]['steps']} steps", flush=True)
    if hasattr(tr.model, "gradient_checkpointing_enable") and not out_of_time("checkpointing"):
        tr.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        _median_steps(tr, 0, 1)
        if cuda:
            memscale.reset_peak_memory_stats(0)
        times["checkpointing"] = _median_steps(tr, 1, a.steps)
        cpu_of("checkpointing", a.steps)
        peaks["checkpointing"] = int(memscale.max_memory_allocated(0)) if cuda else None
        profiles["checkpointing"] = _profile(tr, a.steps + 1, a.top)
        tr.model.gradient_checkpointing_disable()
        print(f"checkpointing: median {times['checkpointing']:.4f} s ({times['checkpointing'] / plain:.2f}x plain), "
              f"peak allocated {_common.fmt_bytes(peaks['checkpointing']) if peaks['checkpointing'] else '-'}", flush=True)
        if cuda:
            # Block-level DTR bounding the device's allocated bytes at what
            # checkpointing allocated at its peak: the equal-memory comparison.
            from memscale._blocks.tracker import device_allocated

            name = "blocks-at-checkpointing"
            tracker = memscale.blocks(tr.model, peaks["checkpointing"], allocated=device_allocated(0))
            import logging

            debug = logging.StreamHandler(sys.stdout)
            memscale_log = logging.getLogger("memscale")
            memscale_log.addHandler(debug)
            level = memscale_log.level
            memscale_log.setLevel(logging.DEBUG)
            try:
                step_peaks = []
                for i in range(3 + a.steps):  # the first measures the tail, the next two the headroom
                    memscale.reset_peak_memory_stats(0)
                    tr.step(i)
                    step_peaks.append(int(memscale.max_memory_allocated(0)))
                    print(f"{name}: step {i}: peak allocated {_common.fmt_bytes(step_peaks[-1])}", flush=True)
                times[name] = _common.median(tr.times[-a.steps:])
                peaks[name] = max(step_peaks[3:])
                summaries[name] = tracker.summary()
                syncs[name] = 0.0
                print(f"{name}: median {times[name]:.4f} s ({times[name] / plain:.2f}x plain), peak allocated "
                      f"{_common.fmt_bytes(peaks[name])}, {summaries[name]['rematerializations']} block recomputes "
                      f"in {summaries[name]['steps']} steps, tail {_common.fmt_bytes(summaries[name]['device_tail'])}, "
                      f"headroom {_common.fmt_bytes(summaries[name]['device_headroom'])}", flush=True)
            except memscale.MemscaleError as exc:
                summaries[name] = {"error": str(exc)}
                print(f"{name}: failed: {exc}", flush=True)
            finally:
                tracker.detach()
                memscale_log.removeHandler(debug)
                memscale_log.setLevel(level)
    result["peaks"] = peaks
    print(f"plain: median {plain:.4f} s, peak allocated {_common.fmt_bytes(peak)}, budget {_common.fmt_bytes(budget)}")
    for name, text in profiles.items():
        print(f"\n== cProfile, one step, {name} (sorted by own time)\n{text}")
    for name, text in trace_tables.items():
        print(f"\n== torch.profiler, one step, {name} (top ops by own CPU time)\n{text}")
    result.update(times=times, ratios={k: v / plain for k, v in times.items()}, peak=peak, budget=budget,
                  summaries=summaries, profiles=profiles, synchronizations_per_step=syncs, cpu_per_step=cpu,
                  traces=trace_info, trace_tables=trace_tables, skipped=skipped,
                  seconds=round(time.monotonic() - t_start, 1))
    if a.out:
        _common.write_json(Path(a.out) / "profile_step.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
