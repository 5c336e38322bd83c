"""``memscale.check`` on 36 Hugging Face model families beyond the zoo (``families.py``),
and on training idioms of plain PyTorch (autocast, channels-last, parametrizations, ...).

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
from typing import Any

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


def _idiom_steps() -> dict[str, tuple[torch.nn.Module, Any, Any]]:
    """Per idiom: ``(module holding the parameters, step(x) -> loss or None
    to check the module itself, x)``."""
    from torch import nn
    from torch.nn import functional as F

    torch.manual_seed(0)
    x = torch.randn(4, 8, 16)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))

    def autocast(inp: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return mlp(inp).float().pow(2).mean()

    conv = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(2, 8),
        nn.PixelShuffle(2), nn.InstanceNorm2d(2, track_running_stats=True, affine=True),
    ).to(memory_format=torch.channels_last)
    normed = nn.Sequential(
        nn.utils.parametrizations.spectral_norm(nn.Linear(16, 16)), nn.ReLU(),
        nn.utils.parametrizations.weight_norm(nn.Linear(16, 4)),
    )
    qkv = nn.Linear(16, 48)

    def sdpa(inp: Any) -> Any:
        q, k, v = (t.transpose(1, 2) for t in qkv(inp).view(4, 8, 3, 2, 8).unbind(2))
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True).sum()

    head = nn.Linear(16, 8)

    def gaussian(inp: Any) -> Any:
        mu, log_std = head(inp).chunk(2, -1)
        d = torch.distributions.Normal(mu, log_std.exp())
        return d.rsample().pow(2).mean() + torch.distributions.kl_divergence(d, torch.distributions.Normal(0.0, 1.0)).mean()

    cell = nn.LSTMCell(16, 16)

    def unrolled(inp: Any) -> Any:
        h = (torch.zeros(4, 16), torch.zeros(4, 16))
        total = 0
        for t in range(inp.shape[1]):
            h = cell(inp[:, t], h)
            total = total + h[0].sum()
        return total

    spectral = nn.ParameterList([nn.Parameter(torch.randn(9, dtype=torch.cfloat))])

    def fft(inp: Any) -> Any:
        return torch.fft.irfft(torch.fft.rfft(inp, dim=-1) * spectral[0], n=16, dim=-1).pow(2).sum()

    return {
        "autocast_bf16": (mlp, autocast, x),
        "channels_last_norms": (conv, lambda inp: conv(inp).sum(), torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)),
        # Spectral norm's power iteration updates its u and v in training:
        # a module is checked with its buffers put back before each run.
        "spectral_and_weight_norm": (normed, None, x),
        "spectral_norm_step": (normed, lambda inp: normed(inp).pow(2).sum(), x),
        "sdpa_dropout_causal": (qkv, sdpa, x),
        "distributions_rsample_kl": (head, gaussian, x),
        "lstm_cell_loop": (cell, unrolled, x),
        "fft_complex_parameter": (spectral, fft, x),
    }


IDIOMS = list(_idiom_steps())


@pytest.mark.parametrize("name", IDIOMS)
def test_idiom_is_safe_under_the_stress_setting(name: str) -> None:
    module, step, x = _idiom_steps()[name]
    if step is None:
        report = check(module, x)
    else:
        report = check(step, x, params=dict(module.named_parameters()), buffers=dict(module.named_buffers()))
    assert report.safe and not report.unstable, str(report)
    assert report.evictions > 0 and report.rematerializations > 0, str(report)
