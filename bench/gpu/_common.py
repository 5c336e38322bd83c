"""Helpers shared by the GPU benchmark scripts in bench/gpu (standard library only).

Each script is run as ``python bench/gpu/NAME.py`` (so this directory is on
``sys.path``) by ``bench/gpu/run_all.sh``, in its own process: PyTorch accepts a
pluggable allocator only once per process and only before CUDA is initialized.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: Repository root (bench/gpu/../..).
ROOT = Path(__file__).resolve().parents[2]


def setup_env() -> None:
    """Environment every script sets before importing torch.

    cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG`` before its first handle to be
    deterministic; transformers must never try the network (the GPU machine has none).
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    plugin = str(ROOT / "pytorch_plugin")
    if plugin not in sys.path:
        sys.path.insert(0, plugin)


def library_path() -> Path:
    """The libmemscale.so the scripts use: ``$MEMSCALE_LIBRARY`` or build/libmemscale.so."""
    env = os.environ.get("MEMSCALE_LIBRARY")
    return Path(env) if env else ROOT / "build" / "libmemscale.so"


def now_iso() -> str:
    """Local date and time, ISO 8601 with the UTC offset."""
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def record(step: str, **fields: Any) -> dict[str, Any]:
    """The header of every JSON result."""
    out: dict[str, Any] = {
        "step": step,
        "date": now_iso(),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "argv": [sys.executable, *sys.argv],
    }
    out.update(fields)
    return out


def write_json(path: str | os.PathLike[str] | None, obj: Any) -> None:
    """Write ``obj`` as indented JSON (atomically); ``None`` path: do nothing."""
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(p)


def read_json(path: str | os.PathLike[str]) -> Any:
    """Parsed JSON of ``path``, or ``None`` if it is missing or malformed."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def cuda_status() -> tuple[bool, str]:
    """(usable, reason) without initializing PyTorch's CUDA state.

    ``torch.cuda.is_available()`` asks the driver for a device count; it does not
    create PyTorch's allocator, so a pluggable allocator can still be installed after it.
    """
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure means: no torch here
        return False, f"torch cannot be imported ({type(exc).__name__}: {exc})"
    if not torch.cuda.is_available():
        return False, (
            f"torch.cuda.is_available() is False (torch {torch.__version__}, "
            f"built for CUDA {torch.version.cuda}); no GPU step can run here"
        )
    return True, "ok"


def skip(step: str, reason: str, json_path: str | None, **fields: Any) -> int:
    """Print a clear skip message, write a 'skipped' result, return exit status 0."""
    print(f"SKIP {step}: {reason}", flush=True)
    write_json(json_path, record(step, status="skipped", reason=reason, **fields))
    return 0


def skip_without_cuda(step: str, device: str, json_path: str | None) -> int | None:
    """On ``device`` "cuda" without a usable CUDA: the skip's exit status
    (a 'skipped' result written, see :func:`skip`); else None (go on)."""
    if device != "cuda":
        return None
    ok, why = cuda_status()
    return None if ok else skip(step, why, json_path)


def driver_or_worker(step: str, a: Any, dry_run: Any, run_worker: Any, driver: Any) -> int:
    """The entry of a script that drives worker processes (``a.worker`` set in
    a worker): the dry run, a skip without CUDA (the worker's result or the
    step's JSON in ``a.out_dir``), then the worker or the driver."""
    setup_env()
    if a.dry_run:
        return dry_run(a)
    if a.device == "cuda":
        ok, why = cuda_status()
        if not ok:
            if a.worker:
                return skip(f"{step}_{a.worker}", why, a.result)
            return skip(step, why, os.path.join(a.out_dir, f"{step}.json"))
    if a.worker:
        return run_worker(a)
    return driver(a)


def median(xs: list[float]) -> float | None:
    """Median of ``xs`` (``None`` when empty)."""
    if not xs:
        return None
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def run_child(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd`` with inherited stdout/stderr; kill it after ``timeout`` seconds.

    Returns ``{"rc", "timed_out", "seconds", "cmd"}``. The child stays in this
    process group, so a ``timeout`` around the parent also ends it.
    """
    print("+ " + " ".join(cmd), flush=True)
    t0 = time.monotonic()
    timed_out = False
    proc = subprocess.Popen(cmd, env=env)
    try:
        rc = proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        timed_out = True
        print(f"TIMEOUT after {timeout:.0f} s: stopping pid {proc.pid}", flush=True)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        rc = proc.returncode
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return {"cmd": cmd, "rc": rc, "timed_out": timed_out, "seconds": round(time.monotonic() - t0, 2)}


def fmt_bytes(n: float | int | None) -> str:
    """``1.50 GiB`` style (``-`` for None)."""
    if n is None:
        return "-"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.2f} {unit}"
        v /= 1024
    return f"{v:.2f} TiB"


def memory_breakdown(torch: Any, top: int = 12) -> dict[str, Any]:
    """Where the memscale allocator's allocated bytes are, as far as Python sees:
    the allocator's allocated and requested bytes next to the storages of every
    CUDA tensor the garbage collector knows (deduplicated by storage), the
    largest first. Allocated bytes no Python tensor holds are PyTorch's own
    (cuBLAS workspaces, autograd buffers) or a leak. For a failure report."""
    import gc

    import memscale

    st = memscale.memory_stats(0)
    storages: dict[int, tuple[int, str]] = {}
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor) or not obj.is_cuda or type(obj).__name__ == "DTRTensor":
                continue
            s = obj.untyped_storage()
            if s.data_ptr() and s.data_ptr() not in storages:
                storages[s.data_ptr()] = (s.nbytes(), f"{type(obj).__name__}{tuple(obj.shape)} {obj.dtype}")
        except Exception:  # noqa: BLE001 - a tensor without storage, a dead weakref
            continue
    largest = sorted(storages.values(), reverse=True)[:top]
    return {
        "allocated": int(st.get("allocated_bytes.all.current", 0)),
        "requested": int(st.get("requested_bytes.all.current", 0)),
        "python_storages": len(storages),
        "python_storage_bytes": sum(n for n, _ in storages.values()),
        "largest": [f"{fmt_bytes(n)} {what}" for n, what in largest],
    }
