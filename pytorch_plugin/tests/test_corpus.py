"""The script corpus (bench/scripts/, run by bench/corpus.py): public-style
training scripts, unchanged, plainly and under ``python -m memscale run``.

With nothing to evict, what a script prints and saves must be bitwise the
plain run's. At half of its measured peak it must be bitwise too, or stop with
memscale's one-line error that the budget is below what a step needs - and
then be below the floor the roomy run measured on whole steps (no budget
below it can run the script). The fast subset
(the hand-written SGD loop and the GAN, nothing to evict) runs in ``make test``;
the rest is slow.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _helpers import require_engine

pytest.importorskip("torch")
require_engine()

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import corpus  # noqa: E402

#: A whole model saved with torch.save(model) names memscale's (detached)
#: hooks: the same state, but loading it needs memscale importable (README, Limits).
PICKLE_NAMES_MEMSCALE = "model.pt: the same state, but its pickle names memscale (hooks left on the model)"


def _check(script: str, variants: list[str]) -> None:
    rows = corpus.check(script, variants)
    assert [r.variant for r in rows] == variants, rows
    for row in rows:
        _check_row(row)


def _check_row(row: corpus.Row) -> None:
    if row.variant == "half" and row.error is not None:
        assert "is below what" in row.error and row.error.startswith("exit 2: memscale: error: "), row
        # below the floor the roomy run measured on whole steps: no budget below it can work
        assert row.below and row.budget is not None and row.budget < row.below, row
        return
    assert row.error is None, row
    assert all(d == PICKLE_NAMES_MEMSCALE for d in row.differences), row.differences
    assert row.steps and row.peak, row
    if row.variant == "roomy":
        assert row.evictions == 0, row
    else:
        assert row.evictions and row.budget and row.peak <= row.budget, row


@pytest.mark.parametrize("script", ["word_lstm", "dcgan"])
def test_a_script_with_nothing_to_evict_prints_and_saves_what_it_does_plainly(script: str) -> None:
    _check(script, ["roomy"])


@pytest.mark.slow  # three runs of each script in child processes
@pytest.mark.parametrize("script", list(corpus.SCRIPTS))
def test_every_corpus_script_under_memscale_run(script: str) -> None:
    _check(script, ["roomy", "half"])


@pytest.mark.slow  # four runs of each script in child processes
@pytest.mark.parametrize("script", ["transformer_lm", "word_lstm", "resnet_dummy"])
def test_the_threshold_memscale_names_trains_the_script(script: str) -> None:
    """At ``--threshold 1%`` the step after the measured ones is refused before it starts and
    the error names the least threshold that works; at it the script trains
    (these three stopped at the floor, the threshold named before, issue 30)."""
    [row] = corpus.check(script, ["named"])
    assert row.named and "x its floor" in row.named, row
    _check_row(row)
