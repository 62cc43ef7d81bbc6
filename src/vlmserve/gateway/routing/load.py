"""Least outstanding tokens: route to the replica with the least work the gateway sent it.

A request adds prompt + expected output tokens (max_tokens) at dispatch — the KV-cache footprint
it will reach, which is what limits how many requests an engine runs at once (the planner counts
load the same way: vlmserve.routing.request_load_tokens). At the first token the prompt estimate
is replaced by the engine's own count when the stream reports it (vLLM does with
`continuous_usage_stats`); the request's tokens leave the count when it completes, fails or is
abandoned. This counts load the way an engine feels it, unlike request counts, which treat a
10-token and a 4,000-token request alike.
"""

from __future__ import annotations

from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing.pipeline import Filter, Pipeline, Scorer, fewer_in_flight_first
from vlmserve.gateway.routing.policy import Lifecycle, Outcome
from vlmserve.routing import LEAST_OUTSTANDING_TOKENS

HALF_SCORE_TOKENS = 4096.0
"""Outstanding tokens at which a replica scores 0.5: about one long multimodal request."""


class OutstandingTokens(Scorer):
    """Scores a replica half / (half + its outstanding tokens): 1 when idle, 0.5 at `half_score_tokens`.

    The score needs no pass over the other replicas, and it falls strictly as the count grows, so
    alone it orders replicas exactly as the raw count does (the count is never negative: each
    refund pays back exactly its own charge)."""

    def __init__(self, half_score_tokens: float = HALF_SCORE_TOKENS) -> None:
        self.half = half_score_tokens
        self.outstanding: dict[int, int] = {}  # replica index -> tokens charged and not refunded
        self._charged: dict[tuple[str, int], int] = {}  # (request id, replica index) -> its charge

    def score(self, request: RoutedRequest, replica: Replica) -> float:
        return self.half / (self.half + self.outstanding.get(replica.index, 0))

    def _charge(self, request: RoutedRequest, replica: Replica, tokens: int) -> None:
        self._charged[(request.request_id, replica.index)] = tokens
        self.outstanding[replica.index] = self.outstanding.get(replica.index, 0) + tokens

    def _refund(self, request: RoutedRequest, replica: Replica) -> None:
        tokens = self._charged.pop((request.request_id, replica.index), 0)
        self.outstanding[replica.index] = self.outstanding.get(replica.index, 0) - tokens

    def on_dispatch(self, request: RoutedRequest, replica: Replica) -> None:
        self._charge(request, replica, request.expected_total_tokens)

    def on_first_token(self, request: RoutedRequest, replica: Replica) -> None:
        if request.engine_prompt_tokens is not None:
            self._refund(request, replica)
            self._charge(request, replica, request.engine_prompt_tokens + request.expected_output_tokens)

    def on_finish(self, request: RoutedRequest, replica: Replica, outcome: Outcome) -> None:
        self._refund(request, replica)

    def forget(self, replica: Replica) -> None:
        self.outstanding.pop(replica.index, None)


class LeastOutstandingTokens(Pipeline):
    """The outstanding-tokens scorer alone; equal counts go to fewer requests in flight, then rotate.

    Image affinity is this pipeline with an image-aware count (image.py), so `outstanding` (the
    gateway's /metrics gauge) covers both."""

    name = LEAST_OUTSTANDING_TOKENS

    def __init__(
        self, tokens: OutstandingTokens | None = None, filters: tuple[Filter, ...] = (), parts: tuple[Lifecycle, ...] = ()
    ) -> None:
        self.tokens = tokens if tokens is not None else OutstandingTokens()
        super().__init__([(1.0, self.tokens)], filters=filters, picker=fewer_in_flight_first, parts=parts)

    @property
    def outstanding(self) -> dict[int, int]:
        """Tokens charged per replica index and not yet refunded."""
        return self.tokens.outstanding
