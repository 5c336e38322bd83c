"""``memscale.check`` on 36 Hugging Face model families beyond the zoo (``families.py``).

Each family's step runs once plainly and once under the stress setting (every
evictable tensor evicted as soon as no running op needs it, every rebuild
verified against its first run): safe means the loss and every gradient are
bitwise the plain run's (for Reformer, which seeds itself from the operating
system's entropy, that every rebuild was bitwise), and the stress run evicted
and rebuilt something. Random weights from configs, no downloads; the whole
module takes about 15 s.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _helpers import deadline, require_engine

require_engine()
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import families  # noqa: E402

from memscale import check  # noqa: E402

#: Families whose plain step differs from itself (they draw a seed from the
#: operating system): ``check`` judges them by their verified rebuilds.
SEEDS_ITSELF: frozenset[str] = frozenset({"reformer"})


@pytest.fixture(autouse=True)
def _deadline() -> Iterator[None]:
    with deadline(120):
        yield


@pytest.mark.parametrize("name", list(families.FAMILIES))
def test_family_is_safe_under_the_stress_setting(name: str) -> None:
    model, batch = families.build(name)
    report = check(families.step_of(model, batch), params=dict(model.named_parameters()))
    assert report.safe, str(report)
    assert report.evictions > 0 and report.rematerializations > 0, str(report)
    assert bool(report.unstable) == (name in SEEDS_ITSELF), str(report)
