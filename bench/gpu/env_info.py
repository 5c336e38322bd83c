"""Where the GPU benchmarks ran: date, device, torch, driver, memscale library, commit.

Writes ``--out`` (JSON) and prints the same. Runs in its own process (it
initializes CUDA through ``torch.cuda.get_device_name``). Never fails: what it
cannot find is recorded as such; exit status 0.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import subprocess
import sys
from typing import Any

import _common


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=_common.ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def collect() -> dict[str, Any]:
    info: dict[str, Any] = _common.record("env", status="ok", machine=platform.machine(), cpus=os.cpu_count())
    info["kernel"] = platform.release()
    info["glibc"] = " ".join(platform.libc_ver())  # what the carried libmemscale.so needs: bench/gpu/README.md
    info["git_commit"] = _run(["git", "rev-parse", "HEAD"]) or "unknown (no git checkout here)"
    status = _run(["git", "status", "--porcelain"])
    info["git_dirty"] = None if status is None else bool(status)
    info["nvidia_smi"] = _run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm", "--format=csv,noheader"]
    )
    lib = _common.library_path()
    info["memscale_library"] = str(lib)
    info["memscale_library_exists"] = lib.exists()
    if lib.exists():
        try:
            h = ctypes.CDLL(str(lib))
            h.memscale_version.restype = ctypes.c_char_p
            info["memscale_version"] = h.memscale_version().decode()
        except (OSError, AttributeError) as exc:
            info["memscale_version"] = f"cannot load: {exc}"
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = bool(torch.cuda.is_available())
        if info["cuda_available"]:
            props = torch.cuda.get_device_properties(0)
            info["device_name"] = torch.cuda.get_device_name(0)
            info["device_count"] = torch.cuda.device_count()
            info["total_memory"] = int(props.total_memory)
            info["capability"] = f"{props.major}.{props.minor}"
            info["multiprocessors"] = props.multi_processor_count
        else:
            info["device_name"] = "none (torch.cuda.is_available() is False)"
    except Exception as exc:  # noqa: BLE001 - recorded
        info["torch"] = f"cannot import: {exc}"
        info["cuda_available"] = False
        info["device_name"] = "unknown (torch cannot be imported)"
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except Exception as exc:  # noqa: BLE001
        info["transformers"] = f"not importable ({type(exc).__name__})"
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="JSON file")
    p.add_argument("--dry-run", action="store_true", help="print what would be collected")
    a = p.parse_args(argv)
    _common.setup_env()
    if a.dry_run:
        print("env --dry-run: would record date, host, git commit, nvidia-smi, torch/CUDA versions, "
              "torch.cuda.get_device_name(0), total memory, transformers and memscale versions")
        return 0
    info = collect()
    _common.write_json(a.out, info)
    for k in ("date", "device_name", "total_memory", "torch", "torch_cuda", "transformers", "nvidia_smi",
              "memscale_version", "memscale_library", "git_commit", "python"):
        v = info.get(k)
        if k == "total_memory" and isinstance(v, int):
            v = f"{v} ({_common.fmt_bytes(v)})"
        print(f"  {k:<18} {v}")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
