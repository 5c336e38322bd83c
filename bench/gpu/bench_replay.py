"""memscale bench on a GPU: the native-allocator model against real memory_stats,
and real allocators replaying recorded snapshots.

1. record: small training runs (an MLP and a 2-layer transformer, 3 steps each)
   under PyTorch's native allocator, default and expandable_segments:True, each in
   its own process, recorded with ``memscale.record_snapshot`` (i.e.
   ``torch.cuda.memory._record_memory_history`` + ``_dump_snapshot``), with
   ``torch.cuda.memory_stats()`` saved at the end.
2. model check: ``build/memscale bench replay SNAPSHOT --allocators torch`` (or
   ``torch-expandable``) on each recording; its peak reserved, peak allocated and
   device allocations are compared with the run's own memory_stats.
3. GPU replay: every recording and samples/snapshots/*.pickle, exported as RMM logs
   (``memscale bench replay --export-rmm``), replayed with ``torch.empty``/``del`` under
   PyTorch's native allocator (default, expandable segments), its cudaMallocAsync
   backend, no caching (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``: cudaMalloc/cudaFree),
   memscale (``memscale.install()``) and RMM's pool resource when ``rmm`` imports;
   each in its own process: peak device memory used (cudaMemGetInfo, sampled after
   every allocation, minus the baseline), peak reserved where the allocator reports
   it, allocation latency p50/p99/max.
4. ``build/memscale bench replay --backend cuda`` (memscale and cuMemAlloc on the GPU)
   and ``build/memscale bench micro --backend cuda`` (a reduced grid).

Writes OUT/bench_replay.json and OUT/bench_replay.md. Without a GPU it prints a
SKIP line and exits 0. Needs build/memscale (carried from the build machine).

    PYTHONPATH=pytorch_plugin python bench/gpu/bench_replay.py --out OUT [--work DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common

STEP = "bench_replay"
RECORD_CONFS = {"native": "", "native-expandable": "expandable_segments:True"}
MODEL_OF = {"native": "torch", "native-expandable": "torch-expandable"}
GPU_ALLOCATORS = ("native", "native-expandable", "cudaMallocAsync", "nocache", "memscale", "rmm-pool")


def child_env(allocator: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    if allocator == "native-expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    elif allocator == "cudaMallocAsync":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    elif allocator == "nocache":
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env


def train(device: str) -> None:
    """The recorded workload: an MLP and a 2-layer transformer, 3 Adam steps each."""
    import torch

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 10)).to(device)
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True), 2).to(device)
    for model, make in ((mlp, lambda: torch.randn(256, 512, device=device)), (enc, lambda: torch.randn(8, 128, 256, device=device))):
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(3):
            loss = model(make()).float().pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        del opt


def child_record(args: argparse.Namespace) -> int:
    _common.setup_env()
    import torch

    import memscale

    with memscale.record_snapshot(args.snapshot, device="cuda"):
        train("cuda")
        torch.cuda.synchronize()
    st = torch.cuda.memory_stats()
    keys = ("reserved_bytes.all.peak", "allocated_bytes.all.peak", "num_device_alloc", "segment.all.peak", "num_alloc_retries")
    _common.write_json(args.json, {k: st.get(k) for k in keys} | {"conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")})
    return 0


def read_log(path: str) -> list[tuple[str, int, int, int]]:
    """An RMM log as (action, pointer, size, stream) rows."""
    with open(path, newline="") as f:
        return [(r["Action"], int(r["Pointer"], 16), int(r["Size"]), int(r["Stream"], 16)) for r in csv.DictReader(f)]


def child_replay(args: argparse.Namespace) -> int:
    """Replay RMM logs under one allocator in this process, one after another
    (a process per allocator: starting CUDA costs seconds, a log far less).
    Between logs every tensor is dropped, the cache emptied and the peaks reset."""
    _common.setup_env()
    import torch

    dev = args.device
    if dev == "cuda":
        if args.allocator == "memscale":
            import memscale

            memscale.install()
        elif args.allocator == "rmm-pool":
            import rmm
            from rmm.allocators.torch import rmm_torch_allocator

            rmm.reinitialize(pool_allocator=True)
            torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
        torch.cuda.init()
        torch.empty(1, device="cuda")  # context and allocator up before the baseline
        torch.cuda.synchronize()
    rows_out = []
    for log in args.log:
        rows_out.append(_replay_one(torch, args.allocator, dev, log))
        _common.write_json(args.json, rows_out)  # what is done survives a timeout
    return 0


def _replay_one(torch: Any, allocator: str, dev: str, log: str) -> dict[str, Any]:
    """One log under the process's allocator: peak device memory used, peak
    reserved, malloc latency."""
    rows = read_log(log)
    reserved = None
    if dev == "cuda":
        torch.cuda.empty_cache()
        _reset_peak(torch, allocator)
    free0 = torch.cuda.mem_get_info()[0] if dev == "cuda" else 0
    streams: dict[int, Any] = {}
    live: dict[int, Any] = {}
    lat: list[int] = []
    peak_used = 0
    t_start = time.perf_counter()
    for action, ptr, size, stream in rows:
        if action == "free":
            live.pop(ptr, None)
            continue
        s = streams.get(stream)
        if s is None and dev == "cuda" and stream != 0:
            s = streams[stream] = torch.cuda.Stream()
        t0 = time.perf_counter_ns()
        if s is not None:
            with torch.cuda.stream(s):
                live[ptr] = torch.empty(size, dtype=torch.uint8, device=dev)
        else:
            live[ptr] = torch.empty(size, dtype=torch.uint8, device=dev)
        lat.append(time.perf_counter_ns() - t0)
        if dev == "cuda":
            peak_used = max(peak_used, free0 - torch.cuda.mem_get_info()[0])
    wall = time.perf_counter() - t_start
    live.clear()
    if dev == "cuda":
        torch.cuda.synchronize()
        try:
            if allocator == "memscale":
                import memscale

                reserved = memscale.max_memory_reserved()
            elif allocator != "rmm-pool":
                reserved = torch.cuda.memory_stats().get("reserved_bytes.all.peak")
        except Exception as exc:  # noqa: BLE001 - a backend without stats
            print(f"note: no reserved peak from {allocator}: {exc}")
    lat.sort()
    n = len(lat)
    return {
        "allocator": allocator, "log": Path(log).stem, "allocs": n, "peak_used": peak_used, "peak_reserved": reserved,
        "malloc_p50_ns": lat[n // 2] if n else None, "malloc_p99_ns": lat[min(n - 1, n * 99 // 100)] if n else None,
        "malloc_max_ns": lat[-1] if n else None, "wall_s": round(wall, 4),
    }


def _reset_peak(torch: Any, allocator: str) -> None:
    try:
        if allocator == "memscale":
            import memscale

            memscale.reset_peak_memory_stats()
        elif allocator != "rmm-pool":
            torch.cuda.reset_peak_memory_stats()
    except Exception as exc:  # noqa: BLE001 - a backend without stats
        print(f"note: no peak reset for {allocator}: {exc}")


def run_cli(cli: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    print("+ " + " ".join([str(cli), *args]), flush=True)
    return subprocess.run([str(cli), *args], capture_output=True, text=True, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu-out", help="directory for bench_replay.json / .md")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--memscale", default=str(_common.ROOT / "build" / "memscale"), help="the memscale CLI built on the build machine")
    ap.add_argument("--time-budget", type=float, default=300, help="seconds for the whole script")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: exercise the replay path without a GPU (samples only, no stats)")
    ap.add_argument("--child", choices=("record", "replay"), help=argparse.SUPPRESS)
    ap.add_argument("--snapshot", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--log", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--allocator", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child == "record":
        return child_record(args)
    if args.child == "replay":
        return child_replay(args)

    out = Path(args.out)
    out_json = out / "bench_replay.json"
    cli = Path(args.memscale)
    samples = sorted((_common.ROOT / "samples" / "snapshots").glob("*.pickle"))
    if args.dry_run:
        print(f"{STEP}: would record {list(RECORD_CONFS)} on CUDA, check the model with {cli}, replay "
              f"{[p.name for p in samples]} + the recordings under {list(GPU_ALLOCATORS)}, run bench replay/micro --backend cuda")
        return 0
    skipped = _common.skip_without_cuda(STEP, args.device, str(out_json))
    if skipped is not None:
        return skipped
    if not cli.exists():
        return _common.skip(STEP, f"{cli} not found (run make here and carry build/)", str(out_json))
    deadline = time.monotonic() + args.time_budget
    left = lambda: max(5.0, deadline - time.monotonic())  # noqa: E731
    work = Path(args.work or tempfile.mkdtemp(prefix="memscale-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    me = str(Path(__file__).resolve())
    res: dict[str, Any] = _common.record(STEP, status="ok", device=args.device, model_check=[], gpu_replay=[], cli={})

    # 1-2. Record under the native allocator and check the model.
    snaps = list(samples)
    if args.device == "cuda":
        for name, conf in RECORD_CONFS.items():
            snap, stats_p = work / f"recorded-{name}.pickle", work / f"recorded-{name}.stats.json"
            r = _common.run_child([sys.executable, me, "--child", "record", "--snapshot", str(snap), "--json", str(stats_p)], min(120, left()), child_env(name))
            stats = _common.read_json(stats_p)
            if r["rc"] != 0 or not stats:
                res["model_check"].append({"run": name, "error": f"recording failed (rc {r['rc']})"})
                continue
            snaps.append(snap)
            p = run_cli(cli, ["bench", "replay", "--quiet", str(snap), "--allocators", MODEL_OF[name], "--json", str(work / f"model-{name}.json")], left())
            model = _common.read_json(work / f"model-{name}.json")
            if p.returncode != 0 or not model:
                res["model_check"].append({"run": name, "error": p.stderr.strip()[-500:]})
                continue
            m = model["results"][0]
            res["model_check"].append({
                "run": name, "conf": conf,
                "real_peak_reserved": stats["reserved_bytes.all.peak"], "model_peak_reserved": m["peak_reserved"],
                "real_peak_allocated": stats["allocated_bytes.all.peak"], "model_peak_allocated": m["peak_allocated"],
                "real_num_device_alloc": stats["num_device_alloc"], "model_device_allocs": m["device_allocs"],
                "equal": stats["reserved_bytes.all.peak"] == m["peak_reserved"] and stats["allocated_bytes.all.peak"] == m["peak_allocated"],
            })

    # 3. Real allocators replay every snapshot.
    logs = work / "logs"
    p = run_cli(cli, ["bench", "replay", "--quiet", *map(str, snaps), "--export-rmm", str(logs), "--json", str(work / "model-all.json")], left())
    if p.returncode != 0:
        res["status"] = "failed"
        res["error"] = p.stderr.strip()[-1000:]
    res["model_all"] = _common.read_json(work / "model-all.json")
    allocators = GPU_ALLOCATORS if args.device == "cuda" else ("cpu",)
    log_files = [str(p) for p in sorted(logs.glob("*.csv"))]
    for alloc in allocators:
        if alloc == "rmm-pool":
            try:
                import rmm  # noqa: F401
            except Exception as exc:  # noqa: BLE001
                res["gpu_replay"].append({"log": "*", "allocator": alloc, "skipped": f"rmm not importable: {exc}"})
                continue
        if not log_files:
            break
        jp = work / f"replay-{alloc}.json"
        r = _common.run_child([sys.executable, me, "--child", "replay", "--log", *log_files, "--allocator", alloc, "--device", args.device,
                               "--json", str(jp)], min(120, left()), child_env(alloc))
        rows = _common.read_json(jp) or []
        done = {row["log"] for row in rows}
        res["gpu_replay"] += rows
        res["gpu_replay"] += [{"allocator": alloc, "log": Path(f).stem, "error": f"rc {r['rc']}" + (" (timeout)" if r.get("timed_out") else "")}
                              for f in log_files if Path(f).stem not in done]

    res["gpu_replay"].sort(key=lambda row: (row.get("log", ""), row.get("allocator", "")))

    # 4. The CLI on the GPU.
    if args.device == "cuda":
        for key, cmd in (("replay_cuda", ["bench", "replay", *map(str, snaps), "--backend", "cuda", "--json", str(work / "cli-replay.json")]),
                         ("micro_cuda", ["bench", "micro", "--backend", "cuda", "--sizes", "512,1MiB,64MiB,1GiB", "--threads", "1,4",
                                         "--iterations", "500", "--json", str(work / "cli-micro.json")])):
            try:
                p = run_cli(cli, cmd, min(150, left()))
                res["cli"][key] = {"rc": p.returncode, "stdout": p.stdout[-6000:], "stderr": p.stderr[-2000:]}
            except subprocess.TimeoutExpired:
                res["cli"][key] = {"rc": None, "error": "timeout"}
    _common.write_json(out_json, res)
    write_markdown(out / "bench_replay.md", res)
    print((out / "bench_replay.md").read_text())
    return 0 if res["status"] == "ok" else 1


def write_markdown(path: Path, res: dict[str, Any]) -> None:
    f = _common.fmt_bytes
    lines = [f"# memscale bench on {res['device']} ({res['date']})", "", "## The native-allocator model against memory_stats()", "",
             "| run | conf | peak reserved real / model | peak allocated real / model | device allocs real / model | equal |", "|---|---|---|---|---|---|"]
    for m in res["model_check"]:
        if "error" in m:
            lines.append(f"| {m['run']} | | ERROR {m['error']} | | | |")
        else:
            lines.append(f"| {m['run']} | {m['conf'] or 'default'} | {f(m['real_peak_reserved'])} / {f(m['model_peak_reserved'])} | "
                         f"{f(m['real_peak_allocated'])} / {f(m['model_peak_allocated'])} | {m['real_num_device_alloc']} / {m['model_device_allocs']} | {m['equal']} |")
    lines += ["", "## Real allocators replaying the snapshots", "",
              "| snapshot | allocator | peak device used | peak reserved | malloc p50 / p99 / max (us, from Python) |", "|---|---|---:|---:|---|"]
    for r in res["gpu_replay"]:
        if "skipped" in r or "error" in r:
            lines.append(f"| {r['log']} | {r['allocator']} | {r.get('skipped') or r.get('error')} | | |")
            continue
        us = lambda v: "-" if v is None else f"{v / 1000:.1f}"  # noqa: E731
        lines.append(f"| {r['log']} | {r['allocator']} | {f(r['peak_used'])} | {f(r['peak_reserved'])} | "
                     f"{us(r['malloc_p50_ns'])} / {us(r['malloc_p99_ns'])} / {us(r['malloc_max_ns'])} |")
    for key, v in res["cli"].items():
        lines += ["", f"## memscale {key.replace('_', ' --backend ')}", "", "```", (v.get("stdout") or v.get("error") or "").rstrip(), "```"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
