"""memscale.config: size parsing and Config validation (no library, no GPU needed)."""

from __future__ import annotations

from typing import Any

import pytest

from memscale import Config, ConfigError
from memscale.config import format_bytes, is_percentage, parse_size

GiB = 1024**3


@pytest.mark.parametrize(
    ("value", "total", "expected"),
    [
        (0, None, 0),
        (123, None, 123),
        ("123", None, 123),
        ("123B", None, 123),
        (" 4 KiB ", None, 4096),
        ("12GiB", None, 12 * GiB),
        ("12gib", None, 12 * GiB),
        ("1.5GB", None, 1_500_000_000),
        ("2MB", None, 2_000_000),
        ("0.5MiB", None, 512 * 1024),
        ("1TiB", None, 1024**4),
        ("1.1TiB", None, 1209462790553),
        ("12 GB", None, 12 * 10**9),
        ("75%", 16 * GiB, 12 * GiB),
        ("100%", 1000, 1000),
        ("12.5%", 800, 100),
        ("33.3 %", 1000, 333),
    ],
)
def test_parse_size_accepts(value: Any, total: int | None, expected: int) -> None:
    assert parse_size(value, name="x", total=total) == expected


@pytest.mark.parametrize(
    ("value", "total", "fragment"),
    [
        (-1, None, "negative"),
        ("lots", None, "expected"),
        ("12 parsecs", None, "expected"),
        ("12GiBs", None, "expected"),
        ("", None, "expected"),
        ("1e3", None, "expected"),
        (".5GiB", None, "expected"),
        ("1.GiB", None, "expected"),
        ("1.5", None, "fraction of a byte"),
        ("+5", None, "expected"),
        (1.5, None, "expected"),
        (True, None, "expected"),
        (None, None, "expected"),
        ("75%", None, "device memory size"),
        ("0%", 100, "(0, 100]"),
        ("101%", 100, "(0, 100]"),
        ("99999999999TiB", None, "too large"),
        (2**63, None, "too large"),
    ],
)
def test_parse_size_rejects_with_the_name(value: Any, total: int | None, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(value, name="MEMSCALE_SOMETHING", total=total)
    assert "MEMSCALE_SOMETHING" in str(info.value)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_parse_size_percent_can_be_refused() -> None:
    with pytest.raises(ConfigError, match="percentage is not accepted"):
        parse_size("50%", name="cap", total=100, allow_percent=False)


def test_is_percentage() -> None:
    assert is_percentage("75%") and is_percentage(" 7.5 % ")
    assert not is_percentage("75") and not is_percentage(75) and not is_percentage(None)


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * GiB) == "3.00 GiB"
    assert format_bytes(-2048) == "-2.00 KiB"


@pytest.mark.parametrize(("mode", "fraction"), [("conservative", 0.90), ("balanced", 0.75), ("aggressive", 0.50)])
def test_modes_map_to_fractions_of_device_memory(mode: str, fraction: float) -> None:
    config = Config(mode=mode)  # type: ignore[arg-type]
    assert config.fraction == fraction
    assert config.budget_for(80 * GiB) == int(80 * GiB * fraction)


def test_default_mode_is_the_threshold_then_balanced() -> None:
    assert Config().mode is None  # the eviction threshold decides when one is set (api tests)
    assert Config().fraction == 0.75
    assert Config().budget_for(1000) == 750
    assert "'balanced' (default)" in Config().describe_budget(1000)
    assert Config(mode="aggressive").describe_budget(1000) == "Config.mode='aggressive': 50% of device memory (1000 B)"
    assert Config(threshold="1KiB").describe_budget(1000) == "Config.threshold='1KiB'"


@pytest.mark.parametrize(("threshold", "expected"), [("60%", 600), (300, 300), ("1KiB", 1024)])
def test_threshold_overrides_mode(threshold: Any, expected: int) -> None:
    assert Config(mode="aggressive", threshold=threshold).budget_for(1000) == expected


@pytest.mark.parametrize("device_bytes", [0, -5, 1.5, "1GiB", None, True])
def test_budget_for_rejects_bad_device_bytes(device_bytes: Any) -> None:
    with pytest.raises(ConfigError, match="device_bytes"):
        Config().budget_for(device_bytes)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mode": "extreme"}, "Config.mode"),
        ({"threshold": "lots"}, "Config.threshold"),
        ({"threshold": 0}, "Config.threshold"),
        ({"threshold": "0%"}, "Config.threshold"),
        ({"threshold": -3}, "Config.threshold"),
        ({"recompute": "yes"}, "Config.recompute"),
        ({"swap": 1}, "Config.swap"),
        ({"park": "yes"}, "Config.park"),
        ({"log_summary": None}, "Config.log_summary"),
        ({"recompute": False, "swap": False}, "Config.recompute"),
        ({"evictee_min_size": -1}, "Config.evictee_min_size"),
        ({"recomp_time_factor": -0.5}, "Config.recomp_time_factor"),
        ({"recomp_time_factor": float("nan")}, "Config.recomp_time_factor"),
        ({"recomp_time_factor": 110}, "from 0 to 8"),
        ({"recomp_memory_factor": 8.5}, "from 0 to 8"),
        ({"recomp_memory_factor": "1"}, "Config.recomp_memory_factor"),
        ({"heuristic": "random"}, "Config.heuristic"),
        ({"device_memory": "50%"}, "Config.device_memory"),
        ({"device_memory": 0}, "Config.device_memory"),
    ],
)
def test_config_validation_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError) as info:
        Config(**kwargs)
    assert field in str(info.value)
    assert isinstance(info.value, ConfigError)


def test_valid_config_and_region_kwargs() -> None:
    config = Config(
        mode="aggressive",
        swap=True,
        evictee_min_size="1MiB",
        recomp_time_factor=1,
        recomp_memory_factor=0.5,
        heuristic="dtr-eq",
        device_memory="8GiB",
    )
    assert config.device_bytes() == 8 * GiB
    assert config.region_kwargs() == {
        "recompute": True,
        "swap": True,
        "park": True,
        "heuristic": "dtr-eq",
        "evictee_min_size": 1024**2,
        "recomp_time_factor": 1.0,
        "recomp_memory_factor": 0.5,
    }
    assert Config().region_kwargs() == {"recompute": True, "swap": False, "park": True}
    assert Config(park=False).region_kwargs()["park"] is False
    assert config.as_dict()["mode"] == "aggressive"


def test_config_is_immutable() -> None:
    config = Config()
    with pytest.raises(AttributeError):
        config.mode = "aggressive"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("env", "want"), [(None, "op"), ("", "op"), ("op", "op"), ("block", "block"), (" block ", "block"), ("auto", "auto")]
)
def test_the_unit_defaults_to_memscale_unit(monkeypatch: pytest.MonkeyPatch, env: str | None, want: str) -> None:
    if env is None:
        monkeypatch.delenv("MEMSCALE_UNIT", raising=False)
    else:
        monkeypatch.setenv("MEMSCALE_UNIT", env)
    assert Config().unit == want
    assert Config(unit="op").unit == "op"  # given: the environment does not matter


def test_a_malformed_memscale_unit_says_what_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSCALE_UNIT", "blocks")
    with pytest.raises(ConfigError, match=r"MEMSCALE_UNIT='blocks': expected op .*, block .* or auto"):
        Config()
    monkeypatch.setenv("MEMSCALE_UNIT", "block")
    with pytest.raises(ConfigError, match=r"unit='block', swap=True\) \(MEMSCALE_UNIT=block\).*unit='op'"):
        Config(swap=True)


def test_auto_refuses_swap_like_block() -> None:
    with pytest.raises(ConfigError, match=r"Config\(unit='auto', swap=True\): blocks .* pass unit='op'"):
        Config(unit="auto", swap=True)
