"""memscale._native.lib: finding libmemscale.so, loading it, and the error/string helpers."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest

from memscale import LibraryLoadError, LibraryNotFoundError, MemscaleError

from memscale._native import lib as _lib

needs_library = pytest.mark.skipif(
    _lib.unavailable_reason() is not None,
    reason=f"libmemscale.so not built: {_lib.unavailable_reason()}",
)


def _fake_tree(tmp_path: Path) -> Path:
    """A repository-like tree; returns its package directory."""
    package = tmp_path / "repo" / "pytorch_plugin" / "memscale"
    package.mkdir(parents=True)
    return package


def test_search_order_without_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = _fake_tree(tmp_path)
    monkeypatch.delenv(_lib.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(_lib, "_PACKAGE_DIR", package)
    paths = _lib.search_paths()
    assert paths[0] == package / "libmemscale.so"
    assert paths[1] == package / "build" / "libmemscale.so"
    assert tmp_path / "repo" / "build" / "libmemscale.so" in paths
    assert paths[-1] == Path("/build/libmemscale.so")


def test_missing_library_lists_every_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = _fake_tree(tmp_path)
    monkeypatch.delenv(_lib.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(_lib, "_PACKAGE_DIR", package)
    if Path("/build/libmemscale.so").exists():  # pragma: no cover - odd machine
        pytest.skip("/build/libmemscale.so exists on this machine")
    with pytest.raises(LibraryNotFoundError) as info:
        _lib.find_library()
    err = info.value
    assert err.searched == [str(p) for p in _lib.search_paths()]
    for place in err.searched:
        assert place in str(err)
    assert "MEMSCALE_LIBRARY" in str(err)
    assert isinstance(err, FileNotFoundError) and isinstance(err, MemscaleError)
    assert _lib.unavailable_reason() == str(err)


def test_env_variable_is_authoritative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = _fake_tree(tmp_path)
    (package / "libmemscale.so").write_bytes(b"")  # would be found without the variable
    monkeypatch.setattr(_lib, "_PACKAGE_DIR", package)
    missing = tmp_path / "nowhere" / "libmemscale.so"
    monkeypatch.setenv(_lib.LIBRARY_ENV, str(missing))
    with pytest.raises(LibraryNotFoundError) as info:
        _lib.find_library()
    assert info.value.searched == [str(missing)]
    assert "MEMSCALE_LIBRARY is set" in str(info.value)


def test_env_variable_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "custom.so"
    target.write_bytes(b"")
    monkeypatch.setenv(_lib.LIBRARY_ENV, str(target))
    assert _lib.find_library() == target.resolve()


def test_next_to_package_beats_build_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = _fake_tree(tmp_path)
    build = tmp_path / "repo" / "build"
    build.mkdir()
    (build / "libmemscale.so").write_bytes(b"")
    monkeypatch.delenv(_lib.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(_lib, "_PACKAGE_DIR", package)
    assert _lib.find_library() == (build / "libmemscale.so").resolve()
    (package / "libmemscale.so").write_bytes(b"")
    assert _lib.find_library() == (package / "libmemscale.so").resolve()


def test_unloadable_file_is_a_load_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bogus = tmp_path / "libmemscale.so"
    bogus.write_text("not an ELF file")
    monkeypatch.setenv(_lib.LIBRARY_ENV, str(bogus))
    monkeypatch.setattr(_lib, "_lib", None)
    monkeypatch.setattr(_lib, "_lib_path", None)
    with pytest.raises(LibraryLoadError, match="cannot load"):
        _lib.lib()
    assert not _lib.is_loaded()


def test_library_without_the_exports_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    other = Path(torch.__file__).parent / "lib" / "libc10.so"
    if not other.is_file():
        pytest.skip(f"{other} not present to stand in for a foreign library")
    monkeypatch.setenv(_lib.LIBRARY_ENV, str(other))
    monkeypatch.setattr(_lib, "_lib", None)
    monkeypatch.setattr(_lib, "_lib_path", None)
    with pytest.raises(LibraryLoadError, match="memscale_malloc"):
        _lib.lib()


@needs_library
def test_loads_and_declares_every_prototype() -> None:
    handle = _lib.lib()
    assert _lib.lib() is handle  # cached
    for name, (restype, argtypes) in _lib._PROTOTYPES.items():
        fn = getattr(handle, name)
        assert fn.restype is restype, name
        assert fn.argtypes == argtypes, name
    assert _lib.is_loaded()
    assert _lib.library_path() == _lib.find_library()
    assert _lib.version()
    assert _lib.function_address("memscale_malloc") == ctypes.cast(handle.memscale_malloc, ctypes.c_void_p).value


@needs_library
def test_check_raises_the_last_error() -> None:
    handle = _lib.lib()
    before = _lib.error_count()
    rc = handle.memscale_set_threshold(0, -5)  # a negative threshold is rejected by the library
    assert rc == -1
    assert _lib.error_count() > before
    message = _lib.last_error()
    assert message
    with pytest.raises(MemscaleError) as info:
        _lib.check(rc, "memscale_set_threshold")
    assert message in str(info.value)
    assert str(info.value).startswith("memscale_set_threshold failed: ")
    assert _lib.check(0) == 0 and _lib.check(7) == 7
    _lib.clear_error()
    assert _lib.last_error() == ""


@needs_library
def test_take_string_reads_frees_and_reports_null() -> None:
    text = _lib.take_string(_lib.lib().memscale_config_json(), "memscale_config_json")
    assert isinstance(json.loads(text), dict)
    assert isinstance(_lib.take_json(_lib.lib().memscale_config_json()), dict)
    _lib.clear_error()
    with pytest.raises(MemscaleError, match="memscale_stats_json failed"):
        _lib.take_string(None, "memscale_stats_json")


@needs_library
def test_bad_device_is_an_error_with_a_message() -> None:
    with pytest.raises(MemscaleError) as info:
        _lib.take_json(_lib.lib().memscale_stats_json(1000), "memscale_stats_json(device=1000)")
    assert "1000" in str(info.value)


@needs_library
def test_library_of_another_version_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from memscale import __version__, _version

    assert _lib.version() == f"memscale {__version__}"  # the one version number
    monkeypatch.setattr(_version, "__version__", "9.9.9")
    monkeypatch.setattr(_lib, "_lib", None)
    monkeypatch.setattr(_lib, "_lib_path", None)
    with pytest.raises(LibraryLoadError, match=r"is 'memscale \d+\.\d+\.\d+' but this Python package is 'memscale 9\.9\.9'"):
        _lib.lib()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("MEMSCALE_HEURISTIC", "bogus"),
        ("MEMSCALE_SIM_CAPACITY", "garbage"),
        ("MEMSCALE_BACKEND", "tpu"),
        ("MEMSCALE_EVICTEE_MIN_SIZE", "abc"),
        ("MEMSCALE_OP_BATCH", "99999999999999999999999"),
        ("MEMSCALE_NO_EXTENSION", "garbage"),
        ("MEMSCALE_RECOMP_TIME_FACTOR", "110"),
    ],
)
def test_a_rejected_configuration_is_raised_by_the_check(variable: str, value: str) -> None:
    """The library reads its configuration once per process: a child process
    with the bad variable. ``check_configuration`` (called by ``install()``)
    raises the library's message naming the variable; with nothing set it
    passes."""
    import os
    import subprocess
    import sys

    code = (
        "from memscale._native import lib\n"
        "from memscale.errors import ConfigError\n"
        "try:\n"
        "    lib.check_configuration()\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('accepted')\n"
    )
    plugin = str(Path(__file__).resolve().parent.parent)
    base = {k: v for k, v in os.environ.items() if not k.startswith("MEMSCALE_") or k == "MEMSCALE_LIBRARY"}
    base["PYTHONPATH"] = plugin
    bad = subprocess.run([sys.executable, "-c", code], env={**base, variable: value}, capture_output=True, text=True)
    assert bad.returncode == 0, bad.stderr
    assert "rejected its configuration" in bad.stdout and variable in bad.stdout, bad.stdout
    good = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True)
    assert good.stdout.strip() == "accepted", good.stdout + good.stderr
