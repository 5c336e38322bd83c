"""The order of the device calls a swap makes (memscale/_region/device.py).

On CUDA a swap-out copies a storage into pinned memory on the current stream
and then drops the device storage, whose block goes back to the cache of the
stream that allocated it. The storage must be ``record_stream``-ed on the
copying stream before it is dropped (otherwise work on the allocating stream
may overwrite the block before the copy reads it), the host buffer must be
pinned memory allocated directly (no pageable buffer copied into a pinned
one), and the copy back must wait for the copy out. A recording
:class:`~memscale._region.device.SwapOps` runs the real copies on CPU
tensors and logs every call, so the order is checked without a GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from memscale._region.device import SwapOps, copy_to_device, copy_to_host  # noqa: E402


class _Cell:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor: torch.Tensor | None = tensor


class _Group:
    def __init__(self, cells: list[_Cell]) -> None:
        self.cells = set(cells)
        self.host_copy: Any = None
        self.swapped_views: Any = None


class RecordingOps(SwapOps):
    """SwapOps on CPU tensors that logs each call; streams are names."""

    def __init__(self, stream: str, cells: list[_Cell]) -> None:
        self.stream = stream
        self.cells = cells
        self.log: list[tuple[Any, ...]] = []

    def current_stream(self, device: torch.device) -> Any:
        return self.stream

    def pinned(self, nbytes: int) -> Any:
        self.log.append(("pinned", nbytes))
        return torch.UntypedStorage(nbytes)

    def device_storage(self, nbytes: int, device: torch.device) -> Any:
        self.log.append(("device_storage", nbytes))
        return torch.UntypedStorage(nbytes)

    def copy(self, dst: Any, src: Any) -> None:
        self.log.append(("copy", self.stream, all(c.tensor is not None for c in self.cells)))
        dst.copy_(src)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        live = all(c.tensor is not None for c in self.cells)
        self.log.append(("record_stream", stream, live))

    def event(self, stream: Any) -> Any:
        self.log.append(("event", stream))
        return f"event on {stream}"

    def wait(self, stream: Any, event: Any) -> None:
        self.log.append(("wait", stream, event))


def test_swap_out_records_the_copy_stream_before_dropping_the_block() -> None:
    base = torch.arange(64, dtype=torch.float32)
    view = base[8:40].view(4, 8).t()
    cells = [_Cell(base), _Cell(view)]
    group = _Group(cells)
    out_ops = RecordingOps("copy-out stream", cells)
    copy_to_host(group, out_ops)
    nbytes = 64 * 4
    assert out_ops.log == [
        ("pinned", nbytes),  # straight into pinned memory, sized exactly
        ("copy", "copy-out stream", True),
        ("record_stream", "copy-out stream", True),  # while the storage is still held
        ("event", "copy-out stream"),
    ]
    assert all(c.tensor is None for c in cells), "the device data is dropped after"

    in_ops = RecordingOps("another stream", cells)
    remade = copy_to_device(group, in_ops)
    assert in_ops.log == [
        ("wait", "another stream", "event on copy-out stream"),  # before the copy back reads the host buffer
        ("device_storage", nbytes),
        ("copy", "another stream", False),
    ]
    assert set(remade) == set(cells)
    assert torch.equal(cells[0].tensor, base)
    assert torch.equal(cells[1].tensor, view), "views keep their geometry"
    assert group.host_copy is None


def test_cpu_swap_makes_no_device_calls() -> None:
    t = torch.randn(16)
    cells = [_Cell(t)]
    group = _Group(cells)
    copy_to_host(group)
    host, device, ready = group.host_copy
    assert device.type == "cpu" and ready is None and not host.is_pinned()
    copy_to_device(group)
    assert torch.equal(cells[0].tensor, t)
