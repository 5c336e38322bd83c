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


# ------------------------------------------- unset MEMSCALE_NATIVE: background build


def _fresh(monkeypatch: Any, cache: Path) -> list[Path]:
    """region_ext as in a new process, with its cache in ``cache``, unset
    MEMSCALE_NATIVE, and the detached builder replaced by a recorder."""
    monkeypatch.setenv("MEMSCALE_CACHE_DIR", str(cache))
    monkeypatch.delenv("MEMSCALE_NATIVE", raising=False)
    for name, value in (("_module", None), ("_reason", None), ("_tried", False), ("_background", None),
                        ("_waiting", None)):
        monkeypatch.setattr(region_ext, name, value)
    spawned: list[Path] = []

    def spawn(log_path: Path) -> int:
        spawned.append(log_path)
        return os.getpid()  # a live process: the marker names it

    monkeypatch.setattr(region_ext, "_spawn_build", spawn)
    return spawned


def test_unset_means_native_and_a_missing_build_starts_in_the_background(tmp_path: Path, monkeypatch: Any) -> None:
    spawned = _fresh(monkeypatch, tmp_path)
    assert region_ext.choice() is None  # automatic: native when its build loads
    assert region_ext.extension() is None  # not held for the build
    reason = region_ext.unavailable_reason()
    assert reason is not None and "background" in reason and str(spawned[0]) in reason
    assert spawned == [region_ext.cached_path().with_suffix(".log")]
    marker = region_ext.cached_path().with_suffix(".building")
    assert marker.read_text().split() == [str(os.getpid())]
    assert region_ext.extension() is None  # asked again: the same build, not a second one
    assert len(spawned) == 1


def test_a_live_build_in_another_process_is_not_started_again(tmp_path: Path, monkeypatch: Any) -> None:
    spawned = _fresh(monkeypatch, tmp_path)
    marker = region_ext.cached_path().with_suffix(".building")
    marker.parent.mkdir(parents=True)
    marker.write_text(f"{os.getppid()}\n")  # a live process builds it
    assert region_ext.extension() is None and spawned == []
    marker.write_text("999999999\n")  # its process is gone: left over
    region_ext._background = None
    assert region_ext.extension() is None and len(spawned) == 1


def test_a_forced_build_waits_for_the_background_one(tmp_path: Path, monkeypatch: Any) -> None:
    _fresh(monkeypatch, tmp_path)
    target = region_ext.cached_path()
    marker = target.with_suffix(".building")
    marker.parent.mkdir(parents=True)
    marker.write_text(f"{os.getppid()}\n")  # a live process other than this one builds it
    polls: list[int] = []

    def sleep(_s: float) -> None:  # the background build finishes after three polls
        polls.append(1)
        if len(polls) == 3:
            target.write_bytes(b"")

    monkeypatch.setattr(region_ext.time, "sleep", sleep)
    region_ext._wait_for(target)
    assert len(polls) == 3 and target.exists()
    marker.write_text("999999999\n")
    target.unlink()
    region_ext._wait_for(target)  # no live builder: returns at once (the caller builds)
    assert len(polls) == 3


def test_the_builder_removes_its_own_marker_only(tmp_path: Path, monkeypatch: Any) -> None:
    _fresh(monkeypatch, tmp_path)
    built: list[Path] = []
    monkeypatch.setattr(region_ext, "_build", lambda target: built.append(target) or target)
    marker = region_ext.cached_path().with_suffix(".building")
    marker.parent.mkdir(parents=True)
    marker.write_text("999999999\n")  # another process's, gone (a live one's is waited for)
    assert region_ext._main() == 0 and built == [region_ext.cached_path()]
    assert marker.exists()
    marker.write_text(f"{os.getpid()}\n")  # this one's (the process started for the build): not waited for
    assert region_ext._main() == 0 and not marker.exists()


def test_a_failed_background_build_is_not_started_again_on_every_run(tmp_path: Path, monkeypatch: Any) -> None:
    spawned = _fresh(monkeypatch, tmp_path)

    def no_compiler(target: Path) -> Path:
        raise RuntimeError("Error building extension: c++: not found")

    monkeypatch.setattr(region_ext, "_build", no_compiler)
    assert region_ext._main() == 1  # the background builder fails
    assert region_ext.extension() is None
    reason = region_ext.unavailable_reason()
    assert reason is not None and "c++: not found" in reason and "MEMSCALE_NATIVE=1" in reason
    assert spawned == []  # not started again
    assert region_ext.cached_path().with_suffix(".failed").exists()


def test_a_build_in_this_process_marks_itself_while_it_runs(tmp_path: Path, monkeypatch: Any) -> None:
    _fresh(monkeypatch, tmp_path)
    marker = region_ext.cached_path().with_suffix(".building")
    seen: list[str] = []

    def build(target: Path) -> Path:
        seen.append(marker.read_text().strip())
        return target

    monkeypatch.setattr(region_ext, "_build", build)
    assert region_ext._build_marked(region_ext.cached_path()) == region_ext.cached_path()
    assert seen == [str(os.getpid())]  # a first use elsewhere meanwhile sees a live builder
    assert not marker.exists()
