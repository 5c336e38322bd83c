"""Externals whose storage someone else frees and refills: ops reading them are
never re-run.

FSDP2 frees a module's unsharded parameters after its forward (``reshard``)
and all-gathers them again before its backward, outside any op the region
sees. An op that read such a parameter can be re-run only while it is
unsharded, which the engine cannot know; so its outputs are registered as not
recomputable (pinned while live, or swapped when swapping is on), like a
collective's. :mod:`memscale._dropin.distributed` marks the storages; the session
tags the externals registered on them (``Session.volatile_roots``).

Holds the process's set of marked storages (by ``StorageImpl`` address; a
stale entry only keeps an op from being recomputed).
"""

from __future__ import annotations

import torch

#: ``untyped_storage()._cdata`` of every storage marked volatile.
STORAGES: set[int] = set()


def mark(t: torch.Tensor) -> None:
    """Mark ``t``'s storage as freed and refilled behind the region's back."""
    STORAGES.add(t.untyped_storage()._cdata)


def is_volatile(t: torch.Tensor) -> bool:
    """Whether ``t``'s storage was marked (cheap when nothing was)."""
    return bool(STORAGES) and t.untyped_storage()._cdata in STORAGES
