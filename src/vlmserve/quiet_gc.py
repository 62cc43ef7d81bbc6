"""Keeping Python's cyclic garbage collector out of a streaming server's latency tail.

A full collection walks every tracked object; in a process that has imported its libraries
and built its app that takes tens of milliseconds, added to every stream in flight
(benchmarks/gateway_overhead.py's run_trial says what it did to its own load generator).
vLLM's API server freezes its start-up heap for the same reason.
"""

from __future__ import annotations

import gc


def quiet_garbage_collector() -> None:
    """For a dedicated server process, once it has started: everything built so far (modules, the
    app, routes) is moved out of the collector's sight (`gc.freeze`), and young-generation
    collections run less often, so the collections that remain walk only what requests left."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
