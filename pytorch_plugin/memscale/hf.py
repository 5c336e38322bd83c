"""Hugging Face ``transformers`` integration: a Trainer callback that logs what
memscale did.

``memscale.wrap(trainer)`` adds it automatically; add it yourself with
``trainer.add_callback(MemscaleCallback(source))`` where ``source`` is anything
:func:`memscale.summary` accepts. transformers is imported only when this module
is, and a missing install raises a clear :class:`ImportError`.
"""

from __future__ import annotations

import logging
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised only without transformers
    raise ImportError(
        "memscale.hf needs Hugging Face transformers: pip install 'memscale[hf]' (or pip install transformers)"
    ) from exc

log = logging.getLogger("memscale")


class MemscaleCallback(TrainerCallback):  # type: ignore[misc]
    """Logs memscale's summary at every Trainer log step and at the end of training.

    Args:
        source: the wrapped model or trainer, or an :func:`memscale.optimize`
            handle: anything :func:`memscale.summary` accepts.
        enabled: log at all (``Config.log_summary``).

    Attributes:
        history: every summary logged, as dicts with the Trainer's global step.
    """

    def __init__(self, source: Any, enabled: bool = True) -> None:
        self.source = source
        self.enabled = enabled
        self.history: list[dict[str, Any]] = []

    def _emit(self, event: str, state: Any) -> None:
        from ._dropin.attached import summary

        current = summary(self.source)
        record = {"event": event, "global_step": getattr(state, "global_step", None), **current.as_dict()}
        self.history.append(record)
        if self.enabled:
            log.info("memscale %s at step %s: %s", event, record["global_step"], current)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Log the running totals alongside the Trainer's own logs."""
        self._emit("log", state)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Log the final totals."""
        self._emit("train_end", state)
