"""The autoscaling rule, defined once: what `export k8s` writes as a KEDA ScaledObject, what
`up --autoscale` runs on one machine and what `plan day` simulates.

The rule is KEDA's Prometheus trigger on the engines' queue (`vllm:num_requests_waiting` summed
over the replicas, as an AverageValue target), carried out by the Kubernetes HPA algorithm:

- desired = ceil(total waiting / waiting_per_replica), unchanged while the ratio to the current
  count is within the HPA's 10 % tolerance, and clamped to [min_replicas, max_replicas];
- scale-up stabilisation: the lowest desired count of the last `scale_up_stabilization_s` seconds
  is what scaling up may go to (0: at once, the HPA default);
- scale-down stabilisation: the highest desired count of the last `scale_down_stabilization_s`
  seconds is what scaling down may go to (a burst's tail does not cost a replica);
- rate limits, as HPA behaviour policies: at most `scale_up_step` replicas added per polling
  interval, and at most one removed per `scale_down_cooldown_s` (the cool-down);
- the metric is read every `polling_interval_s` (KEDA's pollingInterval).

`AutoscaleDecider` is that algorithm as a pure object fed (time, total waiting, current count), so
`up`'s loop and the planner's virtual clock take the same decisions for the same inputs.
All durations are whole seconds, as KEDA and the HPA take them.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vlmserve.vllm_names import NUM_REQUESTS_WAITING

HPA_TOLERANCE = 0.1
"""The HPA leaves the count alone while usage/target is within 1 ± this (its default)."""


class AutoscaleRule(BaseModel):
    """When to add and remove engine replicas; `autoscale:` in a deployment spec."""

    model_config = ConfigDict(extra="forbid")

    min_replicas: int = Field(1, ge=1, le=64)
    max_replicas: int = Field(4, ge=1, le=64)
    waiting_per_replica: float = Field(
        5.0,
        gt=0,
        allow_inf_nan=False,
        description="queued requests per replica the rule aims for (KEDA's threshold on the summed queue)",
    )
    polling_interval_s: int = Field(5, ge=1, le=3600, description="seconds between reads of the queue metric")
    scale_up_stabilization_s: int = Field(0, ge=0, le=3600)
    scale_down_stabilization_s: int = Field(300, ge=0, le=3600)
    scale_down_cooldown_s: int = Field(60, ge=1, le=1800, description="at most one replica removed per this many seconds")
    scale_up_step: int = Field(4, ge=1, le=64, description="at most this many replicas added per polling interval")

    @model_validator(mode="after")
    def _bounds_in_order(self) -> AutoscaleRule:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas {self.max_replicas} is below min_replicas {self.min_replicas}")
        return self

    @property
    def metric(self) -> str:
        """The engine gauge the rule reads (not a setting: the rule is defined on the engine's queue)."""
        return NUM_REQUESTS_WAITING

    def raw_desired(self, total_waiting: float, current: int) -> int:
        """The HPA's count for this reading, before stabilisation and rate limits."""
        if current <= 0:
            wanted = math.ceil(total_waiting / self.waiting_per_replica)
        else:
            ratio = total_waiting / (self.waiting_per_replica * current)
            wanted = current if abs(ratio - 1.0) <= HPA_TOLERANCE else math.ceil(total_waiting / self.waiting_per_replica)
        return max(self.min_replicas, min(self.max_replicas, wanted))


def parse_min_max(text: str) -> tuple[int, int]:
    """'1:4' -> (1, 4); ValueError with the fix otherwise."""
    low, sep, high = text.partition(":")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"'{text}' is not MIN:MAX; write it like 1:4")
    return int(low), int(high)


def scale_down_held(starting: int, serving: int) -> str | None:
    """Why a scale-down the rule asks for must wait, or None (shared by `up` and `plan day`).

    Kubernetes removes a pod that is not ready first; a replica here is never cut short while it
    starts, so the removal waits for it (the next reading decides again), and the last serving
    replica is never the one removed."""
    if starting:
        return "a replica is starting (it is removed, if still not wanted, once it serves)"
    if serving <= 1:
        return "it would leave no replica serving"
    return None


Direction = Literal["up", "down", "hold"]


@dataclass(frozen=True)
class Decision:
    """One reading of the queue and what the rule makes of it."""

    at: float
    total_waiting: float
    current: int
    raw_desired: int
    """The count the reading alone asks for."""
    target: int
    """What the count becomes after stabilisation and rate limits."""
    reason: str

    @property
    def direction(self) -> Direction:
        return "up" if self.target > self.current else "down" if self.target < self.current else "hold"

    def line(self) -> str:
        """The decision as one log line."""
        verb = {"up": "scale up", "down": "scale down", "hold": "hold"}[self.direction]
        return (
            f"autoscale: {verb} {self.current} -> {self.target} replica(s): {self.total_waiting:g} waiting "
            f"(wants {self.raw_desired}); {self.reason}"
        )


class AutoscaleDecider:
    """The HPA algorithm on one rule; feed it every reading, in time order."""

    def __init__(self, rule: AutoscaleRule) -> None:
        self.rule = rule
        self._recommendations: deque[tuple[float, int]] = deque()
        self._added: deque[tuple[float, int]] = deque()
        self._removed: deque[float] = deque()

    def decide(self, now: float, total_waiting: float, current: int) -> Decision:
        """What the count should be now; the caller carries it out (or not) and calls `scaled`."""
        rule = self.rule
        raw = rule.raw_desired(total_waiting, current)
        self._recommendations.append((now, raw))
        longest = max(rule.scale_up_stabilization_s, rule.scale_down_stabilization_s)
        while self._recommendations and self._recommendations[0][0] < now - longest:
            self._recommendations.popleft()
        up_cap = min((n for t, n in self._recommendations if t >= now - rule.scale_up_stabilization_s), default=raw)
        down_floor = max((n for t, n in self._recommendations if t >= now - rule.scale_down_stabilization_s), default=raw)
        if current < up_cap:
            target = up_cap
            added = sum(count for at, count in self._added if at > now - rule.polling_interval_s)
            allowed = max(0, rule.scale_up_step - added)
            if target - current > allowed:
                return Decision(
                    now,
                    total_waiting,
                    current,
                    raw,
                    current + allowed,
                    f"at most {rule.scale_up_step} added per {rule.polling_interval_s} s",
                )
            reason = "queue above target" if up_cap == raw else f"lowest wish of the last {rule.scale_up_stabilization_s} s"
            return Decision(now, total_waiting, current, raw, target, reason)
        if current > down_floor:
            target = max(rule.min_replicas, down_floor)
            if self._removed and self._removed[-1] > now - rule.scale_down_cooldown_s:
                wait = self._removed[-1] + rule.scale_down_cooldown_s - now
                return Decision(now, total_waiting, current, raw, current, f"cool-down: next removal in {wait:.0f} s")
            return Decision(
                now,
                total_waiting,
                current,
                raw,
                current - 1,
                f"highest wish of the last {rule.scale_down_stabilization_s} s is {target}; one at a time",
            )
        if raw < current:
            return Decision(
                now,
                total_waiting,
                current,
                raw,
                current,
                f"stabilisation: wished for {down_floor} within the last {rule.scale_down_stabilization_s} s",
            )
        if raw > current:
            return Decision(
                now,
                total_waiting,
                current,
                raw,
                current,
                f"stabilisation: wished for {up_cap} within the last {rule.scale_up_stabilization_s} s",
            )
        return Decision(now, total_waiting, current, raw, current, "at target")

    def scaled(self, now: float, before: int, after: int) -> None:
        """Record a change carried out (the rate limits count what was done, not what was wished)."""
        if after > before:
            self._added.append((now, after - before))
        elif after < before:
            self._removed.append(now)
        while self._added and self._added[0][0] < now - self.rule.polling_interval_s:
            self._added.popleft()
        while self._removed and self._removed[0] < now - self.rule.scale_down_cooldown_s:
            self._removed.popleft()
