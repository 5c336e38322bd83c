"""The settings of memscale 0.1's API that are not a region's: the log file, the
metrics port, and ``wrap(model, config, sample_input)``'s measured step.

:func:`observe` applies ``Config.log_file`` (a file handler on the ``memscale``
logger, once per file) and ``Config.observability_port`` (:func:`memscale.metrics.serve`).
:func:`measure_step_peak` runs one forward and backward of the sample input in
an unbudgeted region and returns its peak usage: on the CPU, where no device
memory size exists, the mode's budget is a fraction of it (no baseline step
is needed), with the model's gradients, buffers and the random generators put
back as they were.

Holds the log handlers added; no policy.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ..config import Config

log = logging.getLogger("memscale")
_lock = threading.Lock()
_log_files: dict[str, logging.Handler] = {}


def observe(config: Config) -> None:
    """Start what ``config`` asks besides the steps: its log file, its metrics server."""
    if config.log_file is not None:
        path = os.path.abspath(os.fspath(config.log_file))
        with _lock:
            if path not in _log_files:
                handler = logging.FileHandler(path)
                handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
                log.addHandler(handler)
                _log_files[path] = handler
                if log.getEffectiveLevel() > logging.INFO:
                    log.setLevel(logging.INFO)
    if config.observability_port is not None:
        from ..metrics import serve

        port = serve(config.observability_port)
        log.info("memscale: Prometheus metrics on port %d", port)


def measure_step_peak(module: Any, sample_input: Any) -> int:
    """Peak usage of one forward and backward of ``module`` on ``sample_input``
    (a tensor, a tuple of positional arguments or a dict of keyword arguments),
    run in an unbudgeted region; the model's state is put back afterwards."""
    from .._region.check import _loss_of, _preserved, _seeded
    from .._region import dtr

    if isinstance(sample_input, dict):
        args: tuple[Any, ...] = ()
        kwargs = dict(sample_input)
    else:
        args = tuple(sample_input) if isinstance(sample_input, (tuple, list)) else (sample_input,)
        kwargs = {}
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    with _seeded(0), _preserved(params, buffers):
        region = dtr(None)
        with region:
            _loss_of(module(*args, **kwargs)).backward()
    return int(region.summary().get("peak_usage", 0))
