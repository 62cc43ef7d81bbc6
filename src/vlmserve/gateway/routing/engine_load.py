"""Engine-aware routing: score replicas from their engines' own load figures, as llm-d's picker does.

Three scorers read one table of figures per choice (EngineFigures): queue (engine waiting +
running), waiting alone (a queue means the batch is full), and free KV cache; a fourth, images
held (image.py), steers repeats of an image without overloading its holder. Requests the gateway
has in flight beyond what the last scrape counted are added to both queue and waiting: the scrape
has not seen them yet, and without them every request between two scrapes herds onto the replica
that looked idle. Scrapes older than `stale_after_s` are ignored.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from vlmserve.gateway.engine_metrics import EngineLoad
from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing.image import ImageMemory, ImagesHeld
from vlmserve.gateway.routing.pipeline import Pipeline, Scorer
from vlmserve.gateway.routing.policy import Lifecycle
from vlmserve.routing import ENGINE_AWARE

Figures = tuple[float, float, float]
"""(queue, waiting, KV-cache usage 0..1) of one replica."""


class EngineFigures(Lifecycle):
    """The engines' last scrapes, and per choice the three engine scores of each candidate.

    The scores are computed here, once per choice, because they are relative: a queue scores
    1 - queue / the longest queue among the candidates. EngineScore only looks them up."""

    uses_engine_load = True

    def __init__(self, stale_after_s: float = 3.0) -> None:
        self.stale_after_s = stale_after_s
        self.loads: dict[int, EngineLoad] = {}
        # this choice's scores by replica index, overwritten for every candidate of every choice
        self.queue_scores: dict[int, float] = {}
        self.waiting_scores: dict[int, float] = {}
        self.kv_scores: dict[int, float] = {}

    def _figures_of(self, replica: Replica, now: float) -> Figures:
        load = self.loads.get(replica.index)
        if load is None or now - load.scraped_at > self.stale_after_s:
            return float(replica.in_flight), 0.0, 0.0
        engine_queue = load.waiting + load.running
        unseen = max(0.0, replica.in_flight - engine_queue)  # dispatched since the scrape: they will wait too
        return engine_queue + unseen, load.waiting + unseen, load.kv_usage

    def prepare(self, request: RoutedRequest, candidates: Sequence[Replica]) -> None:
        now = time.monotonic()
        figures = [self._figures_of(replica, now) for replica in candidates]
        max_queue = max(f[0] for f in figures) or 1.0
        max_waiting = max(f[1] for f in figures) or 1.0
        queue, waiting, kv = self.queue_scores, self.waiting_scores, self.kv_scores
        for replica, (queued, waited, kv_usage) in zip(candidates, figures):
            queue[replica.index] = 1 - queued / max_queue
            waiting[replica.index] = 1 - waited / max_waiting
            kv[replica.index] = 1 - kv_usage

    def on_load_update(self, replica: Replica, load: EngineLoad) -> None:
        self.loads[replica.index] = load

    def forget(self, replica: Replica) -> None:
        self.loads.pop(replica.index, None)
        for scores in (self.queue_scores, self.waiting_scores, self.kv_scores):
            scores.pop(replica.index, None)


class EngineScore(Scorer):
    """One of EngineFigures' scores, looked up: queue (waiting + running; 1 for an empty queue, 0
    for the longest among the candidates), waiting alone (a queue means the batch is full), or the
    share of KV cache that is free."""

    def __init__(self, scores: dict[int, float]) -> None:
        self._scores = scores  # refilled by EngineFigures.prepare before every choice

    def score(self, request: RoutedRequest, replica: Replica) -> float:
        return self._scores[replica.index]


class EngineAware(Pipeline):
    """Queue, waiting, free KV cache and images held, weighted; the highest sum wins, equal sums rotate."""

    name = ENGINE_AWARE

    def __init__(
        self,
        queue_weight: float = 1.0,
        waiting_weight: float = 1.0,
        kv_weight: float = 1.0,
        stale_after_s: float = 3.0,
        image_weight: float = 1.0,
        load_factor: float = 1.25,
    ) -> None:
        self.engines = engines = EngineFigures(stale_after_s)
        self.memory = ImageMemory()
        super().__init__(
            [
                (queue_weight, EngineScore(engines.queue_scores)),
                (waiting_weight, EngineScore(engines.waiting_scores)),
                (kv_weight, EngineScore(engines.kv_scores)),
                (image_weight, ImagesHeld(self.memory, load_factor)),
            ],
            parts=(engines, self.memory),
        )
