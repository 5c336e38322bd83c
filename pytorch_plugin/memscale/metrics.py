"""Prometheus metrics of memscale: ``Config(observability_port=PORT)``.

:func:`serve` starts prometheus_client's HTTP server on a port with a registry
of its own whose collector reads, at every scrape, the totals of every object
wrapped by :func:`memscale.wrap` / :func:`memscale.optimize` (labelled by the
object's class and id) and the allocator's usage when it is installed:

=======================================  ======================================
``memscale_evictions_total``             evictions (drops and swaps out)
``memscale_rematerializations_total``    tensors rebuilt by recomputation
``memscale_swaps_total``                 swaps out, and in (label ``direction``)
``memscale_steps_total``                 training steps run under memscale
``memscale_peak_usage_bytes``            highest usage of a budgeted step
``memscale_budget_bytes``                the latest step's budget (0: none)
``memscale_compute_overhead_ratio``      (base + recompute) / base compute time
``memscale_allocated_bytes``             allocator's allocated bytes (installed)
=======================================  ======================================

Needs ``prometheus_client`` (``pip install 'memscale[metrics]'``). Holds the
servers started, one per port; no policy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
#: port asked for -> (bound port, server).
_servers: dict[int, tuple[int, Any]] = {}


def _collector() -> Any:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class MemscaleCollector:
        """Reads memscale's totals at every scrape."""

        def collect(self) -> Iterator[Any]:
            from ._dropin import attached
            from ._allocator.install import installed
            from ._allocator.stats import memory_allocated

            labels = ["wrapped"]
            families = {
                "evictions": CounterMetricFamily(
                    "memscale_evictions", "Evictions (drops and swaps out)", labels=labels
                ),
                "rematerializations": CounterMetricFamily(
                    "memscale_rematerializations", "Tensors rebuilt by recomputation", labels=labels
                ),
                "swaps": CounterMetricFamily(
                    "memscale_swaps", "Swaps to and from host memory", labels=[*labels, "direction"]
                ),
                "steps": CounterMetricFamily("memscale_steps", "Training steps run under memscale", labels=labels),
                "peak": GaugeMetricFamily(
                    "memscale_peak_usage_bytes", "Highest usage of a budgeted step", labels=labels
                ),
                "budget": GaugeMetricFamily(
                    "memscale_budget_bytes", "The latest step's budget (0: none)", labels=labels
                ),
                "overhead": GaugeMetricFamily(
                    "memscale_compute_overhead_ratio", "(base + recompute) / base compute time", labels=labels
                ),
            }
            for name, summary in attached.attached_summaries():
                families["evictions"].add_metric([name], summary.evictions)
                families["rematerializations"].add_metric([name], summary.rematerializations)
                families["swaps"].add_metric([name, "out"], summary.swaps_out)
                families["swaps"].add_metric([name, "in"], summary.swaps_in)
                families["steps"].add_metric([name], summary.steps)
                families["peak"].add_metric([name], summary.peak_usage)
                families["budget"].add_metric([name], summary.budget or 0)
                families["overhead"].add_metric([name], summary.overhead)
            yield from families.values()
            if installed() is not None:
                usage = GaugeMetricFamily("memscale_allocated_bytes", "Bytes the memscale allocator has allocated")
                usage.add_metric([], memory_allocated())
                yield usage

    return MemscaleCollector()


def serve(port: int, addr: str = "0.0.0.0") -> int:
    """Serve the metrics on ``port`` (0: a free one) once per process; return
    the port bound.

    Raises:
        ImportError: prometheus_client is not installed (the message says how).
        OSError: the port cannot be bound.
    """
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as exc:
        raise ImportError(
            "Config(observability_port=...) serves Prometheus metrics with prometheus_client: "
            "pip install 'memscale[metrics]' (or pip install prometheus_client)"
        ) from exc
    with _lock:
        if port in _servers and port != 0:
            return _servers[port][0]
        registry = CollectorRegistry(auto_describe=True)
        registry.register(_collector())
        server, _thread = start_http_server(port, addr=addr, registry=registry)
        bound = int(server.server_port)
        _servers[port if port else bound] = (bound, server)
        return bound


def shutdown() -> None:
    """Stop every metrics server started by :func:`serve`."""
    with _lock:
        for _, server in _servers.values():
            server.shutdown()
            server.server_close()
        _servers.clear()
