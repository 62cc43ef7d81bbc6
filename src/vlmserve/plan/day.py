"""`plan day`: a day of traffic under the autoscaling rule, simulated, against fixed provisioning.

The rule is `vlmserve.autoscale`'s, run by the same `AutoscaleDecider` `up --autoscale` runs (and
the same scale-down holds), on a virtual clock, over a load shape (`bench --load-shape` syntax:
a replayed trace, steps, ramps, bursts). Replicas are modelled as the sim engine's constant mode
models them, which keeps the simulation fast enough for a day and comparable with a sim-engine
run of the same deployment:

- a replica runs at most `slots` requests at once (vLLM's --max-num-seqs); each holds its slot for
  ttft + itl x (output_len - 1) seconds; a request that finds no free slot waits in that replica's
  queue (`vllm:num_requests_waiting`, what the rule reads), FIFO;
- the gateway sends each request to the serving replica with the fewest requests outstanding;
- a started replica serves `cold_start_s` after the decision (process start, weights, engine
  init, warm-up all in that one figure); a removed one takes no new request, finishes what it
  holds, and costs until then;
- a request meets the SLO when its time to first token (queue wait + ttft) is within the bound.

Fixed provisioning is the same simulation without the rule: replicas for the peak rate, and for
the mean rate (capacity per replica = slots / service time). Cost counts replica-seconds (started
to stopped, cold starts included) at `price_per_replica_hour`, and is scaled to 24 hours when the
shape is shorter or longer. Every figure is SIMULATED.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from vlmserve.autoscale import AutoscaleDecider, AutoscaleRule, scale_down_held
from vlmserve.bench.load_shapes import LoadShape

DAY_S = 86400.0
TIMELINE_POINTS = 600
"""Replica-count samples kept per strategy (a day polled every 5 s is 17,280 readings)."""


@dataclass(frozen=True)
class ReplicaModel:
    """What one replica does, in the sim engine's constant mode terms."""

    slots: int = 8
    ttft_s: float = 0.05
    itl_s: float = 0.01
    output_len: int = 64

    @property
    def service_s(self) -> float:
        return self.ttft_s + self.itl_s * max(0, self.output_len - 1)

    @property
    def capacity_rps(self) -> float:
        """Requests/s one replica finishes with every slot busy."""
        return self.slots / self.service_s


@dataclass
class _Replica:
    index: int
    started_at: float
    serving_at: float
    running: int = 0
    queue: deque[tuple[float, int]] = field(default_factory=deque)
    draining: bool = False
    stopped_at: float | None = None

    @property
    def outstanding(self) -> int:
        return self.running + len(self.queue)


@dataclass
class DayResult:
    """One strategy over the shape: SLO attainment, replica time and cost, replicas over time."""

    strategy: str
    requests: int
    met_slo: int
    replica_seconds: float
    cost: float | None
    cost_per_day: float | None
    peak_replicas: int
    timeline: list[tuple[float, int]]
    scale_ups: int = 0
    scale_downs: int = 0

    @property
    def attainment(self) -> float:
        return self.met_slo / self.requests if self.requests else 1.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "requests": self.requests,
            "met_slo": self.met_slo,
            "attainment": round(self.attainment, 5),
            "replica_hours": round(self.replica_seconds / 3600, 3),
            "cost": self.cost,
            "cost_per_day": self.cost_per_day,
            "peak_replicas": self.peak_replicas,
            "scale_ups": self.scale_ups,
            "scale_downs": self.scale_downs,
            "timeline": [[round(at, 1), count] for at, count in self.timeline],
        }


@dataclass
class DayPlan:
    """The autoscaled day and the two fixed provisionings, with what was assumed."""

    shape: str
    duration_s: float
    cold_start_s: float
    rule: AutoscaleRule
    replica: ReplicaModel
    slo_ttft_s: float
    autoscaled: DayResult
    fixed_peak: DayResult
    fixed_mean: DayResult

    def as_dict(self) -> dict[str, Any]:
        return {
            "simulated": True,
            "shape": self.shape,
            "duration_s": self.duration_s,
            "cold_start_s": self.cold_start_s,
            "rule": self.rule.model_dump(),
            "replica": {
                "slots": self.replica.slots,
                "ttft_s": self.replica.ttft_s,
                "itl_s": self.replica.itl_s,
                "output_len": self.replica.output_len,
                "capacity_rps": round(self.replica.capacity_rps, 3),
            },
            "slo_ttft_s": self.slo_ttft_s,
            "strategies": [result.as_dict() for result in (self.autoscaled, self.fixed_peak, self.fixed_mean)],
        }


def _thin(timeline: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """Keep every change, at most TIMELINE_POINTS of them (evenly), and the last point."""
    changes = [point for number, point in enumerate(timeline) if number == 0 or point[1] != timeline[number - 1][1]]
    if len(changes) <= TIMELINE_POINTS:
        return changes + ([timeline[-1]] if timeline and changes[-1] != timeline[-1] else [])
    step = len(changes) / TIMELINE_POINTS
    return [changes[int(i * step)] for i in range(TIMELINE_POINTS)] + [timeline[-1]]


def simulate(
    shape: LoadShape,
    replica: ReplicaModel,
    slo_ttft_s: float,
    *,
    rule: AutoscaleRule | None,
    fixed: int | None = None,
    cold_start_s: float = 0.0,
    price_per_replica_hour: float | None = None,
    seed: int = 0,
    strategy: str = "autoscaled",
) -> DayResult:
    """One strategy over the shape: the rule (`rule`) or `fixed` replicas all along."""
    arrivals = shape.arrival_offsets("poisson", 1.0, random.Random(seed))
    end = shape.duration_s
    day = _DaySimulation(replica, slo_ttft_s, rule, rule.min_replicas if rule is not None else (fixed or 1), cold_start_s)
    now = end
    next_arrival = 0
    while next_arrival < len(arrivals) or day.events:
        if next_arrival < len(arrivals) and (not day.events or arrivals[next_arrival] <= day.events[0][0]):
            now = arrivals[next_arrival]
            next_arrival += 1
            day.arrive(now)
            continue
        now, _, kind, index = heapq.heappop(day.events)
        if kind == "done":
            day.finish_request(replicas_index=index, now=now)
        elif kind == "ready":
            day.replica_ready(index, now)
        elif kind == "poll":
            day.poll(now, more_to_come=next_arrival < len(arrivals))
    finish = max(end, now) if arrivals else end
    replica_seconds = sum((r.stopped_at if r.stopped_at is not None else finish) - r.started_at for r in day.replicas)
    cost = None if price_per_replica_hour is None else replica_seconds / 3600 * price_per_replica_hour
    return DayResult(
        strategy=strategy,
        requests=len(arrivals),
        met_slo=day.met,
        replica_seconds=replica_seconds,
        cost=None if cost is None else round(cost, 4),
        cost_per_day=None if cost is None else round(cost * DAY_S / end, 4),
        peak_replicas=max(count for _, count in day.timeline),
        timeline=_thin(day.timeline),
        scale_ups=day.scale_ups,
        scale_downs=day.scale_downs,
    )


class _DaySimulation:
    """The replicas, the event heap and the counts of one simulated day (`simulate` drives it)."""

    def __init__(
        self, replica: ReplicaModel, slo_ttft_s: float, rule: AutoscaleRule | None, first: int, cold_start_s: float
    ) -> None:
        self.replica = replica
        self.slo_ttft_s = slo_ttft_s
        self.rule = rule
        self.cold_start_s = cold_start_s
        self.replicas = [_Replica(index, 0.0, 0.0) for index in range(first)]
        self.decider = AutoscaleDecider(rule) if rule is not None else None
        self.events: list[tuple[float, int, str, int]] = []  # (time, order, kind, replica index)
        self.order = 0
        self.met = 0
        self.scale_ups = 0
        self.scale_downs = 0
        self.timeline: list[tuple[float, int]] = [(0.0, first)]
        if rule is not None:
            self.push(rule.polling_interval_s, "poll", -1)

    def push(self, at: float, kind: str, index: int) -> None:
        self.order += 1
        heapq.heappush(self.events, (at, self.order, kind, index))

    def start_request(self, target: _Replica, arrived: float, now: float) -> None:
        target.running += 1
        if now - arrived + self.replica.ttft_s <= self.slo_ttft_s:
            self.met += 1
        self.push(now + self.replica.service_s, "done", target.index)

    def serving(self, now: float) -> list[_Replica]:
        return [r for r in self.replicas if r.serving_at <= now and not r.draining and r.stopped_at is None]

    @staticmethod
    def maybe_stop(target: _Replica, now: float) -> None:
        if target.draining and target.outstanding == 0 and target.stopped_at is None:
            target.stopped_at = now

    def arrive(self, now: float) -> None:
        """A request arrives: to the least loaded serving replica, started at once or queued there."""
        candidates = self.serving(now)
        if not candidates:  # only while the first replicas start (never with min >= 1 serving)
            candidates = [min((r for r in self.replicas if r.stopped_at is None), key=lambda r: r.serving_at)]
        target = min(candidates, key=lambda r: (r.outstanding, r.index))
        if target.running < self.replica.slots and target.serving_at <= now:
            self.start_request(target, now, now)
        else:
            target.queue.append((now, 0))

    def finish_request(self, replicas_index: int, now: float) -> None:
        """A request ends: the replica's next queued one starts; a draining replica left idle stops."""
        target = self.replicas[replicas_index]
        target.running -= 1
        if target.queue:
            arrived, _ = target.queue.popleft()
            self.start_request(target, arrived, now)
        self.maybe_stop(target, now)

    def replica_ready(self, index: int, now: float) -> None:
        """A new replica finished its cold start: it takes what queued for it, up to its slots."""
        target = self.replicas[index]
        while target.queue and target.running < self.replica.slots:
            arrived, _ = target.queue.popleft()
            self.start_request(target, arrived, now)

    def poll(self, now: float, *, more_to_come: bool) -> None:
        """The autoscaler's poll: scale up (cold starts), or drain the newest ready replica."""
        if self.decider is None or self.rule is None:
            return
        live = [r for r in self.replicas if r.stopped_at is None and not r.draining]
        starting = [r for r in live if r.serving_at > now]
        ready = [r for r in live if r.serving_at <= now]
        waiting = float(sum(len(r.queue) for r in ready))
        decision = self.decider.decide(now, waiting, len(live))
        if decision.direction == "up":
            for _ in range(decision.target - decision.current):
                new = _Replica(len(self.replicas), now, now + self.cold_start_s)
                self.replicas.append(new)
                self.push(new.serving_at, "ready", new.index)
            self.scale_ups += 1
            self.decider.scaled(now, decision.current, decision.target)
        elif decision.direction == "down" and scale_down_held(len(starting), len(ready)) is None:
            victim = max(ready, key=lambda r: r.index)
            victim.draining = True
            self.maybe_stop(victim, now)
            self.scale_downs += 1
            self.decider.scaled(now, decision.current, decision.target)
        self.timeline.append((now, len([r for r in self.replicas if r.stopped_at is None and not r.draining])))
        if more_to_come or any(r.outstanding for r in self.replicas):
            self.push(now + self.rule.polling_interval_s, "poll", -1)


def plan_day(
    shape: LoadShape,
    rule: AutoscaleRule,
    replica: ReplicaModel,
    slo_ttft_s: float,
    cold_start_s: float,
    price_per_replica_hour: float | None = None,
    seed: int = 0,
) -> DayPlan:
    """The rule over the shape, and fixed provisioning for its peak and for its mean rate."""
    mean_rate = shape.expected_requests / shape.duration_s
    at_peak = max(1, math.ceil(shape.peak_rate / replica.capacity_rps))
    at_mean = max(1, math.ceil(mean_rate / replica.capacity_rps))
    common: dict[str, Any] = {"price_per_replica_hour": price_per_replica_hour, "seed": seed}
    return DayPlan(
        shape=shape.text,
        duration_s=shape.duration_s,
        cold_start_s=cold_start_s,
        rule=rule,
        replica=replica,
        slo_ttft_s=slo_ttft_s,
        autoscaled=simulate(shape, replica, slo_ttft_s, rule=rule, cold_start_s=cold_start_s, strategy="autoscaled", **common),
        fixed_peak=simulate(
            shape, replica, slo_ttft_s, rule=None, fixed=at_peak, strategy=f"fixed at peak ({at_peak})", **common
        ),
        fixed_mean=simulate(
            shape, replica, slo_ttft_s, rule=None, fixed=at_mean, strategy=f"fixed at mean ({at_mean})", **common
        ),
    )
