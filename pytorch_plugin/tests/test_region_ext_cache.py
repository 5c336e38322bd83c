"""The native region's build cache: one build per torch, ABI, Python and
source; older sources' builds pruned to the newest few."""

from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path
from typing import Any

from memscale._native import region_ext


def _build(directory: Path, name: str, mtime: int) -> Path:
    path = directory / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    path.write_bytes(b"")
    os.utime(path, (mtime, mtime))
    return path


def test_prune_keeps_the_target_and_the_newest_of_this_torch(tmp_path: Path) -> None:
    name = region_ext.build_name()
    target = _build(tmp_path, f"{name}-target", 100)  # the oldest mtime: kept all the same
    olds = [_build(tmp_path, f"{name}-{i:016x}", 1000 + i) for i in range(6)]
    other_torch = _build(tmp_path, "memscale_region_t0_0_0_abi1_cpython_311-0000000000000000", 1)
    unrelated = tmp_path / "notes.txt"
    unrelated.write_text("x")

    removed = region_ext.prune_builds(target, keep=4)

    assert sorted(removed) == sorted(olds[:3])  # the three oldest of the six
    assert target.exists() and other_torch.exists() and unrelated.exists()
    assert [p.exists() for p in olds] == [False, False, False, True, True, True]


def test_prune_with_nothing_to_remove(tmp_path: Path) -> None:
    target = _build(tmp_path, f"{region_ext.build_name()}-target", 100)
    assert region_ext.prune_builds(target) == []
    assert target.exists()


def test_prune_removes_stale_build_directories_only(tmp_path: Path) -> None:
    target = _build(tmp_path, f"{region_ext.build_name()}-target", 100)
    stale, fresh = tmp_path / "build-stale", tmp_path / "build-fresh"
    for d in (stale, fresh):
        d.mkdir()
        (d / "build.ninja").write_text("")
    old = 1000  # 1970: far older than STALE_BUILD_DIR_S
    os.utime(stale, (old, old))

    removed = region_ext.prune_builds(target)

    assert removed == [stale]
    assert not stale.exists() and fresh.exists()  # a concurrent build's directory is recent



def test_a_build_compiles_a_snapshot_and_is_named_by_it(tmp_path: Path, monkeypatch: Any) -> None:
    """The compiler reads a copy of the sources taken when the build starts,
    and the build is filed under that copy's digest: a source edited during
    the minutes a build takes cannot put the old code under the new name (it
    once did: a stale extension cached for the edited sources)."""
    from torch.utils import cpp_extension

    sources = tmp_path / "csrc"
    sources.mkdir()
    (sources / "a.cpp").write_text('#include "a.h"\n')
    (sources / "a.h").write_text("// v1\n")
    monkeypatch.setattr(region_ext, "SOURCES_DIR", sources)
    monkeypatch.setattr(region_ext, "prune_builds", lambda target: [])
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]

    def named(digest: str) -> Path:
        return tmp_path / f"{region_ext.build_name()}-{digest}{suffix}"

    edits: list[str] = []  # written into a.h while "compiling"
    compiled: list[str] = []

    def fake_load(name: str, sources: list[str], build_directory: str, **_: Any) -> None:
        for text in edits:
            (region_ext.SOURCES_DIR / "a.h").write_text(text)
        compiled.append(Path(sources[0]).with_name("a.h").read_text())
        Path(build_directory, f"{name}{suffix}").write_bytes(b"so")

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    v1 = region_ext.source_digest()

    edits[:] = ["// v2\n"]  # edited during the build
    assert region_ext._build(named(v1)) == named(v1)
    assert compiled[-1] == "// v1\n" and named(v1).read_bytes() == b"so"

    edits[:] = []  # edited between naming the build and starting it
    v2 = region_ext.source_digest()
    assert v2 != v1
    assert region_ext._build(named(v1)) == named(v2)
    assert compiled[-1] == "// v2\n"
