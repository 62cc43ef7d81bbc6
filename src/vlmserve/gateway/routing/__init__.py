"""Routing: which replica takes a request. Filters, then weighted scorers (each 0..1), then a picker.

- policy.py      — the interface the proxy sees (RoutingPolicy, Outcome)
- pipeline.py    — Part/Scorer/Filter/Picker, the weighted picker, Pipeline
- bounds.py      — the load bound affinity stays under (a filter)
- round_robin.py, load.py, prefix.py, image.py, engine_load.py — one scorer family and its policy each
- session.py     — X-Session-ID pins over any policy
- build.py       — the `--policy` names to pipelines
"""

from vlmserve.gateway.routing.bounds import UnderLoadBound, load_bound
from vlmserve.gateway.routing.build import build_policy
from vlmserve.gateway.routing.engine_load import EngineAware
from vlmserve.gateway.routing.image import ImageAffinity, ImageMemory
from vlmserve.gateway.routing.load import LeastOutstandingTokens, OutstandingTokens
from vlmserve.gateway.routing.pipeline import Filter, HighestScore, Part, Picker, Pipeline, Scorer
from vlmserve.gateway.routing.policy import Outcome, RoutingPolicy
from vlmserve.gateway.routing.prefix import PrefixAffinity
from vlmserve.gateway.routing.round_robin import RoundRobin
from vlmserve.gateway.routing.session import SessionAffinity

__all__ = [
    "EngineAware", "Filter", "HighestScore", "ImageAffinity", "ImageMemory", "LeastOutstandingTokens", "Outcome",
    "OutstandingTokens", "Part", "Picker", "Pipeline", "PrefixAffinity", "RoundRobin", "RoutingPolicy", "Scorer",
    "SessionAffinity", "UnderLoadBound", "build_policy", "load_bound",
]
