"""Routing: which replica takes a request. Filters, then weighted scorers (each 0..1), then a picker.

- policy.py      — the interface the proxy sees (RoutingPolicy, its Lifecycle events, Outcome)
- pipeline.py    — Scorer, the filter and picker functions' types, the highest-score pickers, Pipeline
- bounds.py      — the load bound affinity stays under (a filter)
- round_robin.py, load.py, prefix.py, image.py, engine_load.py, adapter.py — one scorer family and its policy each
- session.py     — X-Session-ID pins over any policy
- build.py       — the `--policy` names to pipelines
"""

from vlmserve.gateway.routing.adapter import AdapterAffinity, AdapterResidency
from vlmserve.gateway.routing.bounds import load_bound, under_load_bound
from vlmserve.gateway.routing.build import build_policy
from vlmserve.gateway.routing.engine_load import EngineAware
from vlmserve.gateway.routing.image import ImageAffinity, ImageMemory
from vlmserve.gateway.routing.load import LeastOutstandingTokens, OutstandingTokens
from vlmserve.gateway.routing.pipeline import Filter, Picker, Pipeline, Scorer, fewer_in_flight_first, highest_score
from vlmserve.gateway.routing.policy import Lifecycle, Outcome, RoutingPolicy
from vlmserve.gateway.routing.prefix import PrefixAffinity
from vlmserve.gateway.routing.round_robin import RoundRobin
from vlmserve.gateway.routing.session import SessionAffinity

__all__ = [
    "AdapterAffinity",
    "AdapterResidency",
    "EngineAware",
    "Filter",
    "ImageAffinity",
    "ImageMemory",
    "LeastOutstandingTokens",
    "Lifecycle",
    "Outcome",
    "OutstandingTokens",
    "Picker",
    "Pipeline",
    "PrefixAffinity",
    "RoundRobin",
    "RoutingPolicy",
    "Scorer",
    "SessionAffinity",
    "build_policy",
    "fewer_in_flight_first",
    "highest_score",
    "load_bound",
    "under_load_bound",
]
