"""Write gpu-results.md and gpu-results.json from the step results of run_all.sh.

Reads ``STEPS/steps.tsv`` (one line per step: name, status, exit code, seconds,
command), ``STEPS/env.json`` and every ``STEPS/*.json`` and ``STEPS/*.log``;
writes ``OUT/gpu-results.md`` (date, device, torch, the command lines, a table
per step) and ``OUT/gpu-results.json`` (all step JSONs in one object).
Standard library only; never fails on a missing or malformed step result.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import _common


def read_steps(steps: Path) -> list[dict[str, Any]]:
    rows = []
    try:
        lines = (steps / "steps.tsv").read_text().splitlines()
    except OSError:
        return rows
    for line in lines:
        parts = line.split("\t")
        if len(parts) < 5:
            continue
        name, status, rc, seconds, cmd = parts[:5]
        rows.append({"name": name, "status": status, "rc": rc, "seconds": seconds, "command": cmd})
    return rows


def refine(row: dict[str, Any], data: Any) -> str:
    """The step's status: run_all's, refined by the step's own JSON (skipped / failed inside)."""
    status = row["status"]
    if status == "ok" and isinstance(data, dict):
        inner = data.get("status")
        if inner == "skipped":
            return "skipped: " + str(data.get("reason", ""))[:160]
        if inner not in (None, "ok"):
            return f"{inner}"
    return status


def log_tail(steps: Path, name: str, n: int = 6) -> list[str]:
    try:
        lines = (steps / f"{name}.log").read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if ln.strip()][-n:]


def md_table_lines(steps: Path, name: str) -> list[str]:
    """The markdown table lines (starting with '|') a step printed."""
    try:
        lines = (steps / f"{name}.log").read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if ln.startswith("|")]


def fb(v: Any) -> str:
    return _common.fmt_bytes(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def fnum(v: Any, fmt: str = "{:.3f}") -> str:
    return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def fx(v: Any, fmt: str) -> str:
    """``fmt`` of a number, ``-`` otherwise."""
    return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def native_region_section(results: dict[str, Any], g: Any) -> list[str]:
    """Section 3a: issue 28's GPU targets for the native region, next to plain
    PyTorch and the Python region (gpt2_dtr.py's ``summary.table`` and largest
    batches, native_ext.py's build)."""
    L = ["## 3a. The native region (issue 28): GPT-2 next to plain PyTorch and the Python region", ""]
    ne = results.get("native_ext")
    if isinstance(ne, dict):
        how = "built here" if ne.get("built") else "loaded from the cache"
        if ne.get("status") == "ok":
            L.append(f"Native region's extension (native_ext.py): ok, {how} in {ne.get('seconds')} s against torch "
                     f"{ne.get('torch')}; check op {ne.get('check')}.")
        else:
            reason = str(ne.get("reason") or ne.get("error") or "").replace("|", "\\|")
            L.append(f"Native region's extension (native_ext.py): **{ne.get('status')}**: {reason[:600]} "
                     f"(torch {ne.get('torch')}; tools {ne.get('tools')})")
        L.append("")
    s = g.get("summary") if isinstance(g, dict) else None
    if not s or not s.get("table"):
        L.append(f"gpt2_dtr: {g.get('status') if isinstance(g, dict) else 'no result'} "
                 f"{(g.get('reason') or g.get('error') or '') if isinstance(g, dict) else ''}")
        L.append("")
        return L
    if s.get("native_region_unavailable"):
        L.append(f"**The native region was not measured: {s['native_region_unavailable']}**")
        L.append("")
    L.append(f"{s.get('model', '').replace(', seq ' + str((s.get('seqs') or [''])[0]), '')}; batch {s.get('batch')}; "
             f"device {s.get('device')}. Each row its own process, medians of the measured steps. `/ plain`: step "
             "time over plain PyTorch's at that length (targets: at the card's size <= 1.03x; at 50 % of plain's "
             "peak, ratio minus the engine's compute overhead <= +0.10). CPU: the main thread's CPU time "
             "(`time.thread_time`) and the process's while the step is issued (the final synchronization "
             "excluded); a CUDA backward runs on autograd's own thread, counted in the process's only.")
    L.append("")
    L.append("| seq | variant | status | step (s) | / plain | compute overhead | ratio - overhead | target | "
             "main-thread CPU (s) | / plain | process CPU (s) | issue (s) | peak allocated | evictions / remats | "
             "grads bitwise | s |")
    L.append("|---:|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---|---:|")
    for r in s["table"]:
        met = r.get("meets_target")
        target = r.get("target") or ""
        if met is not None:
            target += " **met**" if met else " **not met**"
        status = str(r.get("status"))
        if r.get("status") != "ok" and r.get("error"):
            status += ": " + str(r["error"]).replace("|", "\\|").replace("\n", " ")[:160]
        ev = "-" if r.get("evictions") is None else f"{r.get('evictions')} / {r.get('rematerializations')}"
        L.append(f"| {r.get('seq')} | {r.get('variant')} | {status} | {fx(r.get('median_step_s'), '{:.4f}')} | "
                 f"{fx(r.get('step_time_ratio'), '{:.3f}')} | {fx(r.get('overhead'), '{:.3f}')} | "
                 f"{fx(r.get('ratio_minus_overhead'), '{:+.3f}')} | {target} | {fx(r.get('median_thread_cpu_s'), '{:.4f}')} | "
                 f"{fx(r.get('thread_cpu_ratio'), '{:.2f}')} | {fx(r.get('median_process_cpu_s'), '{:.4f}')} | "
                 f"{fx(r.get('median_issue_s'), '{:.4f}')} | {fb(r.get('peak_allocated')) if r.get('peak_allocated') else '-'} | "
                 f"{ev} | {r.get('grads_bitwise_equal', '-') if r.get('variant') != 'plain' else '-'} | {r.get('seconds')} |")
    L.append("")
    if "fit_native_max_batch" in s:
        L.append(f"Largest batch at seq {s.get('fit_seq')} (target for the native region: >= 3.5x plain's at <= 1.3x "
                 "plain's time per sample; time per sample = the last step of the largest fitting probe / its batch):")
        L.append("")
        L.append("| run | largest batch | first failing | search stopped | / plain | time per sample / plain | target |")
        L.append("|---|---:|---:|---|---:|---:|---|")
        L.append(f"| plain PyTorch | {s.get('fit_native_max_batch')} | {s.get('fit_native_min_fail')} | "
                 f"{s.get('fit_native_stopped')} | 1 | 1 | |")
        for short, what in (("native_region", "memscale + DTR, native region"), ("memscale", "memscale + DTR, Python region")):
            if f"fit_{short}_max_batch" not in s and f"fit_{short}_stopped" not in s:
                continue
            target = ""
            if short == "native_region" and s.get("fit_native_region_meets_target") is not None:
                target = "**met**" if s["fit_native_region_meets_target"] else "**not met**"
            stopped = str(s.get(f"fit_{short}_stopped")).replace("|", "\\|")[:200]
            L.append(f"| {what} | {s.get(f'fit_{short}_max_batch')} | {s.get(f'fit_{short}_min_fail')} | {stopped} | "
                     f"{fx(s.get(f'fit_{short}_batch_ratio'), '{:.2f}')} | "
                     f"{fx(s.get(f'fit_{short}_time_per_sample_ratio'), '{:.2f}')} | {target} |")
        L.append("")
    return L


def build(out: Path, steps: Path, command: str) -> tuple[str, dict[str, Any]]:
    env = _common.read_json(steps / "env.json") or {}
    rows = read_steps(steps)
    results: dict[str, Any] = {"env": env, "command": command, "steps": []}
    for path in sorted(steps.glob("*.json")):
        if path.name != "env.json":
            results[path.stem] = _common.read_json(path)
    L: list[str] = []
    L.append("# memscale on a GPU: results of bench/gpu/run_all.sh")
    L.append("")
    L.append(f"- Date: {env.get('date', _common.now_iso())}")
    L.append(f"- Device: {env.get('device_name', 'unknown')} ({fb(env.get('total_memory'))}); nvidia-smi: {env.get('nvidia_smi')}")
    L.append(f"- torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), transformers {env.get('transformers')}, "
             f"Python {env.get('python')}")
    L.append(f"- memscale: {env.get('memscale_version')} ({env.get('memscale_library')}); commit {env.get('git_commit')}"
             + (" (working tree has changes)" if env.get("git_dirty") else ""))
    L.append(f"- Host: {env.get('host')}, {env.get('cpus')} CPUs, kernel {env.get('kernel')}")
    L.append("")
    L.append("Command:")
    L.append("")
    L.append(f"    {command}")
    L.append("")
    L.append("## Steps")
    L.append("")
    L.append("| step | status | exit | seconds | command |")
    L.append("|---|---|---:|---:|---|")
    for r in rows:
        data = results.get(r["name"])
        r["final_status"] = refine(r, data)
        results["steps"].append(r)
        cmd = r["command"].replace("|", "\\|")
        L.append(f"| {r['name']} | {r['final_status']} | {r['rc']} | {r['seconds']} | `{cmd}` |")
    L.append("")

    # 0. smoke
    L.append("## 0. Smoke checks (smoke.py)")
    L.append("")
    if env.get("glibc"):
        L.append(f"glibc on this machine: {env.get('glibc')}")
        L.append("")
    smoke = results.get("smoke") or {}
    if smoke.get("checks"):
        L.append("| check | result | detail |")
        L.append("|---|---|---|")
        for c in smoke["checks"]:
            detail = str(c.get("detail", "")).replace("|", "\\|").replace("\n", " ")
            L.append(f"| {c.get('name')} | {c.get('status')} | {detail} |")
    else:
        L.append(f"smoke: {smoke.get('status', 'not run')} {smoke.get('reason') or smoke.get('error') or ''}")
    L.append("")

    # 1. C ABI
    L.append("## 1. C ABI on the device")
    L.append("")
    for name in ("abi_test", "bench_driver"):
        tail = log_tail(steps, name, 3)
        if name == "abi_test":  # its log is long and ends with the verdict
            tail = [t for t in tail if "passed" in t or "SKIPPED" in t] or tail
        if tail:
            L.append(f"{name} (last lines):")
            L.append("")
            L.extend("    " + t for t in tail)
            L.append("")
    bench = md_table_lines(steps, "bench_driver")
    if bench:
        L.append("bench_driver (MEMSCALE_BACKEND=cuda), cached malloc+free pair from C:")
        L.append("")
        L.extend(bench)
        L.append("")
    al = results.get("alloc_latency") or {}
    if al.get("rows"):
        floor = (al.get("ctypes_floor") or {}).get("median_ns")
        L.append(f"alloc_latency.py: malloc+free pair through ctypes, ns per pair (median / min / p90); "
                 f"ctypes floor (2 calls) {floor} ns; device {al.get('device', {}).get('name')}")
        L.append("")
        L.append("| size | memscale median | min | p90 | cuMemAlloc+cuMemFree median | min | p90 | cuMem/memscale |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in al["rows"]:
            m, c = r.get("memscale") or {}, r.get("cuda") or {}
            L.append(f"| {r.get('name')} | {m.get('median_ns')} | {m.get('min_ns')} | {m.get('p90_ns')} | "
                     f"{c.get('median_ns', '-')} | {c.get('min_ns', '-')} | {c.get('p90_ns', '-')} | {r.get('speedup', '-')} |")
        L.append("")
        checks = al.get("device_pointer_checks")
        if checks:
            ok = all(c.get("ok") is not False for c in checks)
            L.append(f"Device-memory check of memscale pointers (cuPointerGetAttribute + memset/copy round trip): "
                     f"{'all passed' if ok else 'FAILED: ' + json.dumps(checks)}")
            L.append("")
    elif al:
        L.append(f"alloc_latency: {al.get('status')} {al.get('reason') or al.get('error') or ''}")
        L.append("")

    # 2. correctness
    L.append("## 2. Correctness: native vs memscale allocator (and memscale + DTR)")
    L.append("")
    L.append("| run | status | peak allocated (fwd+bwd) | losses | DTR budget | evictions | remats | error |")
    L.append("|---|---|---:|---|---:|---:|---:|---|")
    for name in ("correctness_native", "correctness_memscale", "correctness_memscale_dtr"):
        d = results.get(name)
        if not isinstance(d, dict):
            L.append(f"| {name} | no result | | | | | | |")
            continue
        s = d.get("dtr_summary") or {}
        losses = ", ".join(f"{x:.6f}" for x in d.get("losses") or [])
        err = (d.get("error") or d.get("reason") or "").replace("|", "\\|")[:200]
        L.append(f"| {name} | {d.get('status')} | {fb(d.get('peak_allocated_fwd_bwd'))} | {losses} | "
                 f"{fb(d.get('dtr_budget')) if d.get('dtr_budget') else '-'} | {s.get('evictions', '-')} | "
                 f"{s.get('rematerializations', '-')} | {err} |")
    L.append("")
    cmp_ = results.get("correctness_compare")
    if isinstance(cmp_, dict) and cmp_.get("runs"):
        L.append(f"Compared with {cmp_.get('reference')} (allclose rtol {cmp_.get('rtol')}, atol {cmp_.get('atol')}):")
        L.append("")
        L.append("| run | passed | bitwise equal | max abs diff | not close |")
        L.append("|---|---|---|---:|---|")
        for r in cmp_["runs"]:
            L.append(f"| {Path(str(r.get('file'))).name} | {r.get('passed')} | {r.get('bitwise_equal')} | "
                     f"{r.get('max_abs_diff')} | {r.get('error') or ', '.join(r.get('not_close') or []) or '-'} |")
        L.append("")
    elif isinstance(cmp_, dict):
        L.append(f"Comparison: {cmp_.get('status')} {cmp_.get('reason') or cmp_.get('error') or ''}")
        L.append("")

    # 2b. model families under memscale.check on the device
    L.append("## 2b. Model families under memscale.check on the device (families_check.py)")
    L.append("")
    fam = results.get("families_cuda") or {}
    table = md_table_lines(steps, "families_cuda")
    if table:
        L.extend(table)
    else:
        L.append(f"families_cuda: {fam.get('status', 'not run')} {fam.get('reason') or ''}")
    L.append("")

    # 3a. The native region (issue 28)
    g = results.get("gpt2_dtr")
    L.extend(native_region_section(results, g))

    # 3. GPT-2
    L.append("## 3. GPT-2 training: native vs memscale + DTR (Python region, first length)")
    L.append("")
    if isinstance(g, dict) and g.get("summary"):
        s = g["summary"]
        L.append(f"{s.get('model')}; batch {s.get('batch')}; device {s.get('device')}")
        L.append("")
        L.append("| what | value |")
        L.append("|---|---|")
        rows3 = [
            ("native median step", fnum(s.get("native_median_step_s"), "{:.4f} s")),
            ("native peak allocated", fb(s.get("native_peak_allocated"))),
            ("DTR budget (fraction of native peak)", fb(s.get("dtr_budget"))),
            ("memscale peak allocated under DTR", fb(s.get("dtr_peak_allocated"))),
            ("peak <= budget + largest op output (logits, " + fb(s.get("dtr_largest_op_output_bytes")) + ")",
             str(s.get("dtr_peak_within_budget_plus_one_op"))),
            ("DTR median step", fnum(s.get("dtr_median_step_s"), "{:.4f} s")),
            ("step time ratio DTR / native", fnum(s.get("step_time_ratio"), "{:.2f}")),
            ("step-0 loss equal / gradients bitwise equal / allclose", f"{s.get('loss_equal')} / {s.get('grads_bitwise_equal')} / {s.get('grads_allclose')}"),
            ("gradient max abs diff", str(s.get("grads_max_abs_diff"))),
            ("evictions / rematerializations (all steps)", f"{s.get('evictions')} / {s.get('rematerializations')}"),
            ("engine compute overhead", fnum(s.get("dtr_overhead"), "{:.3f}")),
            ("largest batch, native (first failing)", f"{s.get('fit_native_max_batch')} ({s.get('fit_native_min_fail')}; {s.get('fit_native_stopped')})"),
            ("largest batch, memscale + DTR (first failing)", f"{s.get('fit_memscale_max_batch')} ({s.get('fit_memscale_min_fail')}; {s.get('fit_memscale_stopped')})"),
            ("batch ratio memscale / native", fnum(s.get("fit_batch_ratio"), "{:.2f}")),
        ]
        if s.get("dtr_error"):
            rows3.append(("DTR run error", str(s.get("dtr_error")).replace("|", "\\|")[:300]))
        for k, v in rows3:
            L.append(f"| {k} | {v} |")
        L.append("")
        fit = g.get("fit") or {}
        for key in ("native", "native-region", "python-region"):
            runs = (fit.get(key) or {}).get("runs") or []
            if key == "python-region" and not runs:
                runs = (fit.get("memscale") or {}).get("runs") or []  # results before issue 28's native region
            if runs:
                what = {"native": "plain PyTorch", "native-region": "memscale + DTR, native region",
                        "python-region": "memscale + DTR, Python region"}[key]
                L.append(f"Probes, {what}:")
                L.append("")
                L.append("| batch | fits | reason | step times (s) | main-thread CPU (s) | peak allocated | seconds |")
                L.append("|---:|---|---|---|---|---:|---:|")
                for r in runs:
                    why = (r.get("reason") or r.get("status") or "").replace("|", "\\|")[:200]
                    L.append(f"| {r.get('batch')} | {r.get('fits')} | {why} | "
                             f"{r.get('step_times') or ''} | {r.get('thread_cpu_s') or ''} | {fb(r.get('peak_allocated'))} | "
                             f"{(r.get('process') or {}).get('seconds')} |")
                L.append("")
    elif isinstance(g, dict):
        L.append(f"gpt2_dtr: {g.get('status')} {g.get('reason') or g.get('error') or ''}")
        L.append("")
    else:
        L.append("gpt2_dtr: no result")
        L.append("")
    fw = results.get("fresh_warm")
    if isinstance(fw, dict) and fw.get("summary"):
        s = fw["summary"]
        L.append("### GPT-2 + DTR: fresh process vs warm (fresh_warm.py, issue 29)")
        L.append("")
        L.append(f"Budget {fb(fw.get('budget'))}; fresh / warm median step {fnum(s.get('fresh_over_warm'), '{:.3f}')} "
                 f"(within 5 %: {s.get('within_5_percent')}); with step boundaries / warm "
                 f"{fnum(s.get('fresh_plan_over_warm'), '{:.3f}')} (within 5 %: {s.get('fresh_plan_within_5_percent')}).")
        L.append("")
        L.append("| variant | status | median step | remaps per steady step | peak reserved |")
        L.append("|---|---|---:|---|---:|")
        for v in ("fresh", "warm", "fresh-plan"):
            if f"{v}_status" in s:
                L.append(f"| {v} | {s.get(v + '_status')} | {fnum(s.get(v + '_median_step_s'), '{:.4f} s')} | "
                         f"{s.get(v + '_remaps_per_steady_step')} | {fb(s.get(v + '_peak_reserved'))} |")
        L.append("")
    elif isinstance(fw, dict):
        L.append(f"fresh_warm: {fw.get('status')} {fw.get('reason') or fw.get('error') or ''}")
        L.append("")
    prof = results.get("profile_step") if isinstance(results.get("profile_step"), dict) else None
    if prof and prof.get("times"):
        L.append("## 4. Where a GPT-2 step under a region spends its time (profile_step.py)")
        L.append("")
        L.append(f"Batch {prof.get('batch')} x {prof.get('seq', 512)} tokens, per-op C extension: "
                 f"{prof.get('crossing_extension')}; budget {fb(prof.get('budget'))} of a plain peak of "
                 f"{fb(prof.get('peak'))} (`card`: no threshold, the device's memory; `wrap-card`: the drop-in API at "
                 "`threshold=\"100%\"`, its steps after two that fit untracked).")
        L.append("")
        if prof.get("native_region_extension"):
            L.append(f"Native region (`*-native`, `MEMSCALE_NATIVE=1`; issue 28): extension "
                     f"{prof.get('native_region_extension')}; variants {prof.get('native_status')}"
                     + (f"; skipped for time: {', '.join(prof['skipped'])}" if prof.get("skipped") else "") + ".")
            L.append("")
        L.append("| variant | median step (s) | / plain | main-thread CPU per step (s) | process CPU (s) | "
                 "synchronizations per step | peak allocated | evictions / block recomputes |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        syncs = prof.get("synchronizations_per_step") or {}
        peaks = prof.get("peaks") or {}
        summaries = prof.get("summaries") or {}
        cpu = prof.get("cpu_per_step") or {}
        for k, v in prof["times"].items():
            sync = syncs.get(k)
            peak = fb(peaks[k]) if peaks.get(k) else "-"
            recomputes = summaries.get(k, {}).get("rematerializations", "-") if k in peaks else "-"
            if k not in peaks and isinstance(summaries.get(k), dict) and "evictions" in summaries[k]:
                recomputes = f"{summaries[k].get('evictions')} evictions"
            c = cpu.get(k) or {}
            L.append(f"| {k} | {v:.4f} | {prof['ratios'][k]:.2f} | {fx(c.get('thread'), '{:.4f}')} | "
                     f"{fx(c.get('process'), '{:.4f}')} | {'-' if sync is None else f'{sync:.1f}'} "
                     f"| {peak} | {recomputes} |")
        for k, s in summaries.items():
            if isinstance(s, dict) and "error" in s:
                L.append(f"| {k} | failed: {str(s['error'])[:300]} | | | | |")
        L.append("")
        for k, info in (prof.get("traces") or {}).items():
            kept = (f"`steps/{info.get('file')}` in gpu-steps.tar.gz ({fb(info.get('gz_bytes'))} gzipped, "
                    f"{fb(info.get('raw_bytes'))} as JSON)" if info.get("file") else
                    f"not kept ({info.get('dropped') or info.get('error')})")
            L.append(f"torch.profiler trace of one `{k}` step ({fx(info.get('step_s'), '{:.4f}')} s under the "
                     f"profiler): {kept}; top ops by own CPU time:")
            L.append("")
            L.extend("    " + line for line in str((prof.get("trace_tables") or {}).get(k, "")).strip().splitlines()[:32])
            L.append("")
        for k, text in (prof.get("profiles") or {}).items():
            L.append(f"cProfile of one `{k}` step, top functions by own time:")
            L.append("")
            L.extend("    " + line for line in text.strip().splitlines()[:40])
            L.append("")
    # 5. memscale plan's predictions against this GPU (issue 31)
    pc = results.get("planner_check") if isinstance(results.get("planner_check"), dict) else None
    if pc is not None:
        L.append("## 5. memscale plan's predictions against this GPU (planner_check.py)")
        L.append("")
        tables = md_table_lines(steps, "planner_check")
        if pc.get("status") == "skipped" or not tables:
            L.append(f"planner_check: {pc.get('status')} {pc.get('reason') or pc.get('error') or ''}")
        else:
            L.append(f"GPT-2 ({(pc.get('parameters') or 0) / 1e6:.1f}M parameters, eager attention, fp32, SGD) planned "
                     "on meta with the cost model of "
                     f"`{pc.get('cost_device')}` (device table memory {fb(pc.get('table_memory'))}, CUDA total "
                     f"{fb(pc.get('total_memory'))}), measured under PyTorch's allocator; then the top ops by "
                     "device time against the cost model's estimate:")
            L.append("")
            for i, line in enumerate(tables):  # two tables: a blank line where the second header starts
                if i and line.startswith("| batch x seq | op |"):
                    L.append("")
                L.append(line)
        L.append("")
    L.append("## Keeping these numbers")
    L.append("")
    L.append("Copy this file into `bench/results/` (for example `bench/results/gpu-<date>-<device>.md`) keeping the "
             "date, device and command above; the raw step JSONs and logs are in `gpu-steps.tar.gz`.")
    L.append("")
    return "\n".join(L), results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for gpu-results.md / .json")
    p.add_argument("--steps", required=True, help="directory with the step results")
    p.add_argument("--command", default="bash bench/gpu/run_all.sh", help="the command line to record")
    a = p.parse_args(argv)
    md, results = build(Path(a.out), Path(a.steps), a.command)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "gpu-results.md").write_text(md)
    _common.write_json(Path(a.out) / "gpu-results.json", results)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
