"""`up --autoscale`: the autoscaling rule (vlmserve.autoscale) carried out on one machine.

Every `polling_interval_s` the loop reads the rule's metric (`vllm:num_requests_waiting`) from
each serving replica's own /metrics, sums it, and asks the rule's `AutoscaleDecider` what the
count should be, counting replicas that are starting as KEDA counts pods that are not ready yet.
Then:

- scale up: a standby replica is started, verified (the supervisor's readiness checks: the
  model listed, a 1-token generation, the served configuration), warmed with a few requests
  sent straight to it, and only then written into the gateway's members file; it is "in
  rotation" once the gateway's own /metrics shows it routable. Each phase is timed.
- scale down: the newest serving replica leaves the members file first; the gateway stops
  sending it requests and drains it; the process is stopped only when the gateway has forgotten
  it (its last request ended) and its engine reports nothing running or waiting.

Every decision is one log line (supervisor.log and the console; a hold repeated unchanged, the
same count for the same reason, is said once, not every reading), and every decision is counted in `autoscale.prom` beside state.json (Prometheus text format,
for node-exporter's textfile collector) with the replica counts and the queue read. Recent
scale events, with their phase timings, are in state.json (`autoscale`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, write_to_textfile

from vlmserve.autoscale import AutoscaleDecider, AutoscaleRule, Decision, scale_down_held
from vlmserve.deploy.guard import StepGuard
from vlmserve.deploy.members import ManagedProcess
from vlmserve.deploy.members_file import DISCOVER_INTERVAL_S
from vlmserve.deploy.progress import parse_progress
from vlmserve.deploy.readiness import ReadinessAborted
from vlmserve.errors import UserError

if TYPE_CHECKING:
    from vlmserve.deploy.supervisor import Supervisor

METRICS_FILE = "autoscale.prom"
SCRAPE_TIMEOUT_S = 2.0
WARM_REQUESTS = 2
"""Requests sent straight to a new replica before it joins the rotation (after the readiness
check's own 1-token generation): the first requests through a fresh engine pay one-time costs."""
WARM_MAX_TOKENS = 8
ADMIT_TIMEOUT_S = 30.0
"""How long the gateway may take to route to a replica written into its members file."""
DRAIN_TIMEOUT_S = 900.0
"""The longest a retiring replica's requests may take to finish before it is stopped anyway."""
DRAIN_POLL_S = 0.2
EVENTS_KEPT = 200


def gateway_replicas(metrics_text: str) -> dict[str, bool]:
    """host:port -> routable, for every replica the gateway knows (draining ones included),
    from its `vlmserve_gateway_in_flight` and `vlmserve_gateway_replica_healthy` gauges."""
    known: dict[str, bool] = {}
    for line in metrics_text.splitlines():
        for name in ("vlmserve_gateway_in_flight{", "vlmserve_gateway_replica_healthy{"):
            if line.startswith(name) and 'replica="' in line:
                replica = line.split('replica="', 1)[1].split('"', 1)[0]
                routable = known.get(replica, False)
                if name.startswith("vlmserve_gateway_replica_healthy"):
                    routable = line.rsplit(" ", 1)[-1].strip() not in ("0", "0.0")
                known[replica] = routable
    return known


class Autoscaler:
    """Runs one rule against one supervisor's replicas, in its own thread, until the supervisor stops."""

    def __init__(self, supervisor: Supervisor, rule: AutoscaleRule, say: Callable[[str], None]) -> None:
        self.supervisor = supervisor
        self.rule = rule
        self.decider = AutoscaleDecider(rule)
        self.say = say
        self._guard = StepGuard(say)
        self._thread: threading.Thread | None = None
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._warming: set[int] = set()
        """Replicas started and verified but not warmed: kept out of the members file."""
        self.events: deque[dict[str, object]] = deque(maxlen=EVENTS_KEPT)
        self.last: Decision | None = None
        self._last_logged: tuple[int, int, str] | None = None
        self._last_held: str | None = None
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "vlmserve_autoscale_decisions",
            "Autoscale decisions, by direction (up, down, hold)",
            ["direction"],
            registry=self.registry,
        )
        self.scale_events = Counter(
            "vlmserve_autoscale_events",
            "Scale events carried out, by kind (in_rotation, start_failed, stopped)",
            ["event"],
            registry=self.registry,
        )
        self.replica_gauge = Gauge(
            "vlmserve_autoscale_replicas",
            "Replicas by state (ready, starting, draining, standby)",
            ["state"],
            registry=self.registry,
        )
        self.desired_gauge = Gauge("vlmserve_autoscale_desired_replicas", "The count the rule wants now", registry=self.registry)
        self.waiting_gauge = Gauge(
            "vlmserve_autoscale_waiting_requests",
            f"The rule's metric ({rule.metric}) summed over the serving replicas",
            registry=self.registry,
        )

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self.say(
            f"autoscale: {self.rule.min_replicas}..{self.rule.max_replicas} replicas on {self.rule.metric}, "
            f"{self.rule.waiting_per_replica:g} waiting per replica, read every {self.rule.polling_interval_s} s, "
            f"scale-down after {self.rule.scale_down_stabilization_s} s, one removal per {self.rule.scale_down_cooldown_s} s"
        )
        self._thread = threading.Thread(target=self._loop, name="vlmserve-autoscale", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait for the loop and any scale event in progress (the supervisor's stop event ends them)."""
        for thread in [self._thread, *self._workers]:
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=60)

    @property
    def _stopping(self) -> threading.Event:
        return self.supervisor._stopping

    def _loop(self) -> None:
        while not self._stopping.wait(self.rule.polling_interval_s):
            self._guard.run("autoscale step", self.step)

    # ---- one reading, one decision --------------------------------------------------------

    def _by_state(self) -> dict[str, list[ManagedProcess]]:
        groups: dict[str, list[ManagedProcess]] = {}
        with self.supervisor._lock:
            for member in self.supervisor.replicas:
                groups.setdefault(member.state, []).append(member)
        return groups

    def step(self) -> Decision | None:
        """Read the queue, decide, and start carrying the decision out (in worker threads)."""
        groups = self._by_state()
        serving = groups.get("ready", [])
        counted = serving + groups.get("starting", []) + groups.get("restarting", []) + groups.get("failed", [])
        waiting = 0.0
        for member in serving:
            reading = self._scrape(member.plan.url)
            waiting += reading[0] if reading else 0.0
        now = time.time()
        decision = self.decider.decide(now, waiting, len(counted))
        self.last = decision
        self.decisions.labels(decision.direction).inc()
        self.desired_gauge.set(decision.raw_desired)
        self.waiting_gauge.set(waiting)
        key = (decision.current, decision.target, decision.reason.split(":")[0])
        if decision.direction != "hold" or key != self._last_logged:  # a hold repeated unchanged is said once
            self.say(decision.line())
        self._last_logged = key
        if decision.direction != "down":
            self._last_held = None
        if decision.direction == "up":
            standby = groups.get("standby", []) + groups.get("pending", [])
            for member in sorted(standby, key=lambda m: m.plan.index)[: decision.target - decision.current]:
                self.supervisor.set_state(member, "starting")
                self._spawn(self._bring_up, member, now, f"autoscale-up-{member.plan.index}")
            self.decider.scaled(now, decision.current, decision.target)
        elif decision.direction == "down":
            held = scale_down_held(len(groups.get("starting", [])), len(serving))
            if held is not None:
                if held != self._last_held:
                    self.say(f"autoscale: scale-down to {decision.target} held: {held}")
                self._last_held = held
                self._write_metrics()
                return decision
            victim = max(serving, key=lambda m: m.plan.index)
            self.supervisor.set_state(victim, "draining")
            self._spawn(self._retire, victim, now, f"autoscale-down-{victim.plan.index}")
            self.decider.scaled(now, decision.current, decision.target)
        self._write_metrics()
        return decision

    def _spawn(self, work: Callable[[ManagedProcess, float], None], member: ManagedProcess, decided_at: float, name: str) -> None:
        thread = threading.Thread(target=lambda: self._guard.run(name, lambda: work(member, decided_at)), name=name, daemon=True)
        self._workers = [t for t in self._workers if t.is_alive()] + [thread]
        thread.start()

    def _scrape(self, url: str) -> tuple[float, float] | None:
        """(waiting, running) from one engine's /metrics; None when it does not answer."""
        try:
            reply = httpx.get(f"{url}/metrics", timeout=SCRAPE_TIMEOUT_S, trust_env=False)
        except httpx.HTTPError:
            return None
        progress = parse_progress(reply.text) if reply.status_code == 200 else None
        return (progress.waiting, progress.running) if progress is not None else None

    def _gateway_view(self) -> dict[str, bool] | None:
        gateway = self.supervisor.gateway
        if gateway is None:
            return None
        try:
            reply = httpx.get(f"{gateway.plan.url}/metrics", timeout=SCRAPE_TIMEOUT_S, trust_env=False, verify=False)  # noqa: S501 - our own gateway, maybe with a self-signed certificate
        except httpx.HTTPError:
            return None
        return gateway_replicas(reply.text) if reply.status_code == 200 else None

    # ---- scale up: start, verify, warm, admit ---------------------------------------------

    def _bring_up(self, member: ManagedProcess, decided_at: float) -> None:
        label = member.plan.label
        with self._lock:
            self._warming.add(member.plan.index)
        try:
            self.supervisor.start_replica(member)
        except ReadinessAborted:
            return
        except Exception as problem:  # noqa: BLE001 - UserError or a surprise: back to standby, the rule retries
            self.supervisor.stop_replica(member)
            with self._lock:
                self._warming.discard(member.plan.index)
            what = problem.message if isinstance(problem, UserError) else f"{type(problem).__name__}: {problem}"
            self.scale_events.labels("start_failed").inc()
            self.say(f"autoscale: {label} failed to start ({(what.splitlines() or [''])[0]}); back to standby")
            self._record("start_failed", member, decided_at, {})
            self._write_metrics()
            return
        ready_at = time.time()
        warm_s = self._warm(member)
        warmed_at = time.time()
        with self._lock:
            self._warming.discard(member.plan.index)
        self.supervisor.publish_members(self._held_back())
        name = member.plan.url.split("://", 1)[1]
        deadline = time.monotonic() + ADMIT_TIMEOUT_S
        while not self._stopping.is_set():
            view = self._gateway_view()
            if view is not None and view.get(name):
                break
            if time.monotonic() > deadline:
                self.say(
                    f"autoscale: the gateway does not route to {label} {ADMIT_TIMEOUT_S:.0f} s after it joined "
                    "its members; leaving it listed"
                )
                break
            time.sleep(DISCOVER_INTERVAL_S / 2)
        in_rotation = time.time()
        started = member.started_at or decided_at
        phases = {
            "decided_to_start_s": round(started - decided_at, 3),
            **(member.cold_start or {"start_to_ready_s": round(ready_at - started, 3)}),
            "warm_s": round(warm_s, 3),
            "admit_s": round(in_rotation - warmed_at, 3),
            "decision_to_rotation_s": round(in_rotation - decided_at, 3),
        }
        self.scale_events.labels("in_rotation").inc()
        engine = "".join(
            f", {name.removesuffix('_s').replace('_', ' ')} {phases[name]:.1f} s"
            for name in ("start_to_weights_s", "weights_to_engine_s", "engine_to_listening_s")
            if name in phases
        )
        self.say(
            f"autoscale: {label} in rotation {phases['decision_to_rotation_s']:.1f} s after the decision "
            f"(ready after {phases['start_to_ready_s']:.1f} s{engine}; warmed in {warm_s:.2f} s, "
            f"routed to {phases['admit_s']:.2f} s later)"
        )
        self._record("in_rotation", member, decided_at, phases)
        self._write_metrics()

    def _warm(self, member: ManagedProcess) -> float:
        """A few short generations straight to the replica; the seconds they took."""
        expected = member.plan.expected
        began = time.monotonic()
        if expected is None:
            return 0.0
        body = {
            "model": expected.served_model_name,
            "max_tokens": WARM_MAX_TOKENS,
            "messages": [{"role": "user", "content": "Warm-up: say hello."}],
        }
        for _ in range(WARM_REQUESTS):
            try:
                httpx.post(f"{member.plan.url}/v1/chat/completions", json=body, timeout=120, trust_env=False)
            except httpx.HTTPError:
                break  # the readiness check passed; a failed warm-up only means a colder first request
        return time.monotonic() - began

    # ---- scale down: out of the members, drained, then stopped ----------------------------

    def _retire(self, member: ManagedProcess, decided_at: float) -> None:
        label = member.plan.label
        name = member.plan.url.split("://", 1)[1]
        self.supervisor.publish_members(self._held_back())
        left_at = time.time()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        # the gateway needs two reads of the file to apply it: wait at least that before trusting "absent"
        earliest = time.monotonic() + 3 * DISCOVER_INTERVAL_S
        idle_reads = 0
        while not self._stopping.is_set():
            view = self._gateway_view()
            gone = view is not None and name not in view and time.monotonic() >= earliest
            reading = self._scrape(member.plan.url) if gone else None
            idle_reads = idle_reads + 1 if reading is not None and reading[0] == 0 and reading[1] == 0 else 0
            if idle_reads >= 2:
                break
            if time.monotonic() > deadline:
                self.say(f"autoscale: {label} still busy {DRAIN_TIMEOUT_S:.0f} s after leaving the rotation; stopping it")
                break
            time.sleep(DRAIN_POLL_S)
        drained_at = time.time()
        self.supervisor.stop_replica(member)
        phases = {"drain_s": round(drained_at - left_at, 3), "decision_to_stopped_s": round(time.time() - decided_at, 3)}
        self.scale_events.labels("stopped").inc()
        self.say(
            f"autoscale: {label} drained in {phases['drain_s']:.1f} s and stopped "
            f"(out of the rotation first, stopped after its last request)"
        )
        self._record("stopped", member, decided_at, phases)
        self._write_metrics()

    # ---- bookkeeping ------------------------------------------------------------------------

    def _held_back(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._warming)

    def _record(self, event: str, member: ManagedProcess, decided_at: float, phases: dict[str, float]) -> None:
        with self._lock:
            self.events.append(
                {
                    "event": event,
                    "replica": member.plan.index,
                    "url": member.plan.url,
                    "decided_at": decided_at,
                    "at": time.time(),
                    **phases,
                }
            )

    def _write_metrics(self) -> None:
        groups = self._by_state()
        for state in ("ready", "starting", "draining", "standby"):
            self.replica_gauge.labels(state).set(len(groups.get(state, [])))
        try:
            write_to_textfile(str(self.supervisor.state_dir / METRICS_FILE), self.registry)
        except OSError:
            pass  # a full disk: the state saver already raises the alarm; decisions go on

    def summary(self) -> dict[str, object]:
        """What state.json records: the rule, the last decision, and recent scale events."""
        with self._lock:
            events = list(self.events)
        last = self.last
        return {
            "rule": self.rule.model_dump(),
            "metric": self.rule.metric,
            "last_decision": None
            if last is None
            else {
                "at": last.at,
                "waiting": last.total_waiting,
                "current": last.current,
                "wants": last.raw_desired,
                "target": last.target,
                "reason": last.reason,
            },
            "events": events,
        }
