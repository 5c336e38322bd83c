#!/usr/bin/env python3
"""``memscale.check`` across Hugging Face model families beyond the zoo.

For each family of ``pytorch_plugin/tests/families.py`` (tiny random-weight
models from configs, no downloads): one plain step and one step under the
stress setting (every evictable tensor evicted as soon as no running op needs
it, every rebuild verified against a fingerprint of its first run), compared
bitwise: the loss and every gradient. A row: safe or not, the stress run's
evictions and rebuilds, what the step disagrees with itself on (two plain
runs seeded alike; judged by its verified rebuilds then), the first failure,
and the wall time.

    MEMSCALE_LIBRARY=build/libmemscale.so HF_HUB_OFFLINE=1 \\
        .venv/bin/python bench/families_check.py --markdown bench/results/families-check.md

``--device cuda`` runs the same on the GPU (bench/gpu/run_all.sh does, for a
subset, with deterministic algorithms on); without a CUDA device it writes a
"skipped" JSON and exits 0. ``--json PATH`` writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytorch_plugin"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytorch_plugin" / "tests"))

import families
import torch

import memscale


def run_family(name: str, device: str = "cpu") -> dict[str, Any]:
    """Check one family on ``device``; the row of the table."""
    t0 = time.perf_counter()
    try:
        model, batch = families.build(name)
        model.to(device)
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        report = memscale.check(families.step_of(model, batch), params=dict(model.named_parameters()))
    except Exception as exc:  # a family that cannot even be built or run plainly
        return {"name": name, "safe": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                "seconds": time.perf_counter() - t0}
    return {
        "name": name,
        "safe": report.safe,
        "evictions": report.evictions,
        "rematerializations": report.rematerializations,
        "unstable": report.unstable,
        "error": (report.error or "").splitlines()[0] if report.error else ", ".join(report.differences[:3]),
        "seconds": time.perf_counter() - t0,
    }


def markdown(rows: list[dict[str, Any]], cmd: str, wall: float, device: str) -> str:
    safe = sum(r["safe"] for r in rows)
    lines = [
        "# `memscale.check` across model families",
        "",
        f"Date: {datetime.date.today()}. {device}, {torch.get_num_threads()} torch thread(s); torch {torch.__version__}, "
        f"transformers {__import__('transformers').__version__}. Families from "
        "`pytorch_plugin/tests/families.py` (tiny random-weight models from configs); each: one plain step and "
        "one under the stress setting (`memscale.dtr(stress=True)`: every evictable tensor evicted as soon as no "
        "running op needs it, every rebuild verified against its first run), loss and every gradient compared "
        f"bitwise. The same check runs in `make test` (`test_families.py`). Wall time {wall:.0f} s.",
        "",
        f"    {cmd}",
        "",
        f"{safe} of {len(rows)} families safe.",
        "",
        "| family | safe | evictions | rebuilds | not deterministic by itself | first failure / differences | s |",
        "|---|---|---:|---:|---|---|---:|",
    ]
    for r in rows:
        unstable = ", ".join(r.get("unstable") or [])[:60]
        lines.append(
            f"| {r['name']} | {'yes' if r['safe'] else 'NO'} | {r.get('evictions', '-')} | "
            f"{r.get('rematerializations', '-')} | {unstable} | {r['error'][:200]} | {r['seconds']:.1f} |"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="*", default=list(families.FAMILIES), choices=list(families.FAMILIES))
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--markdown", type=Path)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--json", type=Path, help="write the rows (and the status) as JSON")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("families_check: skipped: no CUDA device", flush=True)
            if args.json:
                args.json.write_text(json.dumps({"status": "skipped", "reason": "no CUDA device"}))
            return 0
        # Nondeterministic CUDA kernels (atomic adds in embedding backward)
        # would make a verified rebuild differ from its first run.
        torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    t0 = time.perf_counter()
    rows = []
    for name in args.families:
        row = run_family(name, args.device)
        rows.append(row)
        print(f"{name}: {'safe' if row['safe'] else 'NOT SAFE'} {row.get('evictions', '-')} evictions "
              f"{row['error'][:120]} ({row['seconds']:.1f} s)", flush=True)
    cmd = "MEMSCALE_LIBRARY=build/libmemscale.so HF_HUB_OFFLINE=1 .venv/bin/python bench/families_check.py " + " ".join(
        shlex.quote(a) for a in sys.argv[1:]
    )
    text = markdown(rows, cmd.strip(), time.perf_counter() - t0, device)
    if args.json:
        safe = all(r["safe"] for r in rows)
        args.json.write_text(json.dumps({"status": "ok" if safe else "failed", "device": device, "rows": rows}))
    if args.markdown:
        args.markdown.write_text(text)
    else:
        print(text)
    return 0 if all(r["safe"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
