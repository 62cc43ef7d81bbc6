"""Start, ready-check, verify, restart and stop the processes of one deployment.

`Supervisor(spec)` turns a DeploymentSpec into running engine replicas (vLLM or the
simulated engine) and, when asked and available, the gateway in front of them:

- Checks first, before anything starts: the model exists, the ports are free, there is
  enough free memory, and no other supervisor runs a deployment of the same name.
- Replicas start one at a time: two vLLM engines profiling memory at once is a known cause
  of start-up failures. Each must pass the readiness checks (vlmserve.deploy.readiness) and serve
  the configuration asked for, from a process vlmserve itself started.
- A replica that dies is restarted with exponential back-off, and the event is logged.
  One that hangs (no answer to /health, then none to a 1-token generation; see
  vlmserve.deploy.liveness) is killed outright and restarted the same way, with the reason recorded.
- A name whose previous supervisor is gone but whose processes still run is refused (the
  state file that lets `vlmserve down` find them is never overwritten).
- The trust boundary: with a gateway in front, replicas listen on loopback only; a host
  reachable from other machines needs a keys file or an explicit `open: true`.
- `stop()` (also on leaving the `with` block) stops every process tree it started.

It is a library object (used by `vlmserve up`, `vlmserve demo` and `sweep`); signal handling
belongs to the command that owns the terminal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from vlmserve.deploy import processes
from vlmserve.deploy.state import deployment_dir, read_state, supervisor_alive, write_state
from vlmserve.errors import UserError
from vlmserve.deploy.front_door import check_gateway_files, check_trust_boundary, gateway_argv
from vlmserve.deploy.liveness import LivenessWatch, Subject
from vlmserve.deploy.readiness import (
    ExpectedConfig,
    ReadinessAborted,
    ServedConfig,
    StaleReplica,
    config_mismatches,
    wait_until_ready,
)
from vlmserve.spec import EMBEDDED_MODEL, DeploymentSpec

Role = Literal["replica", "gateway"]
ProcessState = Literal["pending", "starting", "ready", "restarting", "failed", "stopped"]

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 60.0
STABLE_AFTER_S = 120.0
"""A process that stayed up this long has its back-off reset to the start value."""
MONITOR_POLL_S = 0.5
SIM_ENGINE_HOST_GB = 0.3


@dataclass
class ProcessPlan:
    """One process to supervise: what to run, where it listens, how to know it's right."""

    role: Role
    index: int
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    log_path: Path
    expected: ExpectedConfig | None
    devices: str = ""
    scheme: Literal["http", "https"] = "http"

    @property
    def label(self) -> str:
        return f"replica {self.index}" if self.role == "replica" else "gateway"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


@dataclass
class ManagedProcess:
    """A supervised process and its history."""

    plan: ProcessPlan
    process: subprocess.Popen[bytes] | None = None
    state: ProcessState = "pending"
    restarts: int = 0
    started_at: float | None = None
    ready_at: float | None = None
    last_exit_code: int | None = None
    backoff_s: float = BACKOFF_START_S
    restart_at: float | None = None
    served: ServedConfig | None = None
    pid_created_at: float | None = None
    """The process's start time as the OS reports it: with the pid, it identifies the process
    for `vlmserve down` even after the supervisor is gone (pids are reused)."""
    kill_reason: str | None = None
    """Set when the supervisor killed the process itself (hung); the exit it causes is not a crash."""
    last_restart_reason: str | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def as_state(self) -> dict[str, Any]:
        return {
            "role": self.plan.role,
            "index": self.plan.index,
            "url": self.plan.url,
            "port": self.plan.port,
            "pid": self.pid,
            "pid_created_at": self.pid_created_at,
            "state": self.state,
            "restarts": self.restarts,
            "started_at": self.started_at,
            "ready_at": self.ready_at,
            "last_exit_code": self.last_exit_code,
            "last_restart_reason": self.last_restart_reason,
            "devices": self.plan.devices,
            "log": str(self.plan.log_path),
            "served": self.served.as_dict() if self.served else None,
        }


EventSink = Callable[[str], None]


class Supervisor:
    """Runs one deployment; `with Supervisor(spec) as sup:` starts it and stops it on exit."""

    def __init__(
        self, spec: DeploymentSpec, *, on_event: EventSink | None = None, state_dir: Path | None = None
    ) -> None:
        """state_dir: where state.json, supervisor.log and logs/ go (default
        $VLMSERVE_HOME/deployments/<name>; tests pass a temporary directory)."""
        self.spec = spec
        self._on_event = on_event
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None
        self._watches: list[LivenessWatch] = []
        self.replicas: list[ManagedProcess] = []
        self.gateway: ManagedProcess | None = None
        self.gateway_note: str | None = None
        self.device_kind: str = "sim" if spec.engine == "sim" else "unknown"
        self.model_path: str = spec.model
        self.notes: list[str] = []
        self.started_at = time.time()
        self.state_dir = Path(state_dir) if state_dir is not None else deployment_dir(spec.name)
        self.log_dir = Path(spec.log_dir).expanduser() if spec.log_dir else self.state_dir / "logs"

    # ---- public surface -------------------------------------------------------------

    @property
    def served_model_name(self) -> str:
        from vlmserve.engines.vllm import served_model_name

        return served_model_name(self.spec)

    @property
    def replica_urls(self) -> list[str]:
        return [replica.plan.url for replica in self.replicas]

    @property
    def endpoint(self) -> str:
        """Where clients go: the gateway when it runs, else the first replica."""
        if self.gateway is not None and self.gateway.state == "ready":
            return self.gateway.plan.url
        return self.replica_urls[0]

    def __enter__(self) -> "Supervisor":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> "Supervisor":
        """Check, then start every replica one at a time, then the gateway; return when ready."""
        try:
            self._preflight()
            self._write_state()
            for replica in self.replicas:
                self._start_and_wait(replica, first_start=True)
            if self.gateway is not None:
                self._start_and_wait(self.gateway, first_start=True)
        except BaseException:
            self.stop()
            raise
        self._monitor = threading.Thread(target=self._monitor_loop, name="vlmserve-supervisor", daemon=True)
        self._monitor.start()
        if self.spec.liveness.enabled:
            self._watches = [self._watch(replica) for replica in self.replicas]
            for watch in self._watches:
                watch.start()
        return self

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until stop() is called (or timeout_s passes)."""
        self._stopping.wait(timeout_s)

    def stop(self) -> None:
        """Stop every process tree this supervisor started; idempotent."""
        self._stopping.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=30)
        for watch in self._watches:
            watch.join(timeout=self.spec.liveness.timeout_s + self.spec.liveness.probe_timeout_s + 1)
        with self._lock:
            members = ([self.gateway] if self.gateway else []) + list(reversed(self.replicas))
            for member in members:
                if member.state == "stopped":
                    continue  # already stopped once: never signal a process group id twice
                if member.process is not None and member.process.poll() is None:
                    self._event(f"stopping {member.plan.label} (pid {member.pid})")
                if member.process is not None:
                    processes.stop_process_tree(member.process)
                    member.last_exit_code = member.process.returncode
                member.state = "stopped"
                member.started_at = None
            if self.replicas:
                self._write_state()

    def status(self) -> dict[str, Any]:
        """The state written to state.json."""
        with self._lock:
            return {
                "name": self.spec.name,
                "engine": self.spec.engine,
                "model": self.spec.model,
                "model_path": self.model_path,
                "served_model_name": self.served_model_name,
                "device_kind": self.device_kind,
                "supervisor_pid": os.getpid(),
                "supervisor_started_at": psutil.Process().create_time(),
                "started_at": self.started_at,
                "updated_at": time.time(),
                "endpoint": self.endpoint if self.replicas else None,
                "open": self.is_open,
                "gateway_note": self.gateway_note,
                "notes": self.notes,
                "replicas": [replica.as_state() for replica in self.replicas],
                "gateway": self.gateway.as_state() if self.gateway else None,
                "spec": self.spec.model_dump(mode="json"),
            }

    @property
    def is_open(self) -> bool:
        """Does the front door serve anyone who can reach it (no keys asked)?"""
        return self.gateway is None or not self.spec.keys_file

    # ---- checks before anything starts ------------------------------------------------

    def _preflight(self) -> None:
        self._refuse_running_duplicate()
        check_trust_boundary(self.spec, gateway_runs=self.spec.gateway and gateway_available())
        if self.spec.engine == "vllm":
            plans = self._plan_vllm_replicas()
        else:
            plans = self._plan_sim_replicas()
        self._check_ports(self.spec.replica_host, [plan.port for plan in plans])
        self.replicas = [ManagedProcess(plan=plan) for plan in plans]
        gateway_plan = self._plan_gateway()
        if gateway_plan is not None:
            self._check_ports(self.spec.host, [gateway_plan.port])
            self.gateway = ManagedProcess(plan=gateway_plan)
        for note in self.notes:
            self._event(note)

    def _refuse_running_duplicate(self) -> None:
        """One deployment per name: refuse while its supervisor runs, or while processes a
        killed supervisor left behind still run (their only record is this state file)."""
        previous = read_state(self.state_dir / "state.json")
        if not previous or previous.get("supervisor_pid") == os.getpid():
            return
        if supervisor_alive(previous):
            raise UserError(
                f"deployment '{self.spec.name}' is already running (supervisor pid {previous['supervisor_pid']}); "
                f"stop it with `vlmserve down {self.spec.name}` or give this one another --name"
            )
        orphans = living_members(previous)
        if orphans:
            listed = ", ".join(f"{member_label(member)} pid {member['pid']}" for member in orphans)
            raise UserError(
                f"deployment '{self.spec.name}' still has processes running from a supervisor that is gone "
                f"({listed}); stop them with `vlmserve down {self.spec.name}`, then start it again"
            )

    def _check_ports(self, host: str, ports: list[int]) -> None:
        for port in ports:
            if not processes.port_is_free(host, port):
                owners = processes.port_listeners(port)
                who = f" by {processes.describe_pid(owners[0])}" if owners else ""
                raise UserError(
                    f"port {port} on {host} is already in use{who}; stop that process or choose "
                    "another --port"
                )

    def _plan_vllm_replicas(self) -> list[ProcessPlan]:
        from vlmserve.engines import vllm as vllm_engine

        self.model_path = resolve_model_path(self.spec.model, on_event=self._event)
        self.device_kind = vllm_engine.detect_device_kind(self.spec.devices)
        launches = vllm_engine.plan_launches(self.spec, self.model_path, self.device_kind)  # type: ignore[arg-type]
        self.notes.extend(launches[0].notes if launches else [])
        needed_gb = vllm_engine.host_memory_needed_gb(self.spec, self.model_path, self.device_kind)  # type: ignore[arg-type]
        check_free_memory(needed_gb, self.spec.replicas)
        expected = ExpectedConfig(
            served_model_name=vllm_engine.served_model_name(self.spec),
            root=self.model_path,
            max_model_len=self.spec.engine_args.max_model_len,
            cache_config=_expected_cache_labels(self.spec),
            expects_images=model_expects_images(self.spec.model, self.model_path),
        )
        return [
            ProcessPlan(
                role="replica",
                index=index,
                argv=launch.argv,
                env=launch.full_env(),
                host=self.spec.replica_host,
                port=launch.port,
                log_path=self.log_dir / f"replica-{index}.log",
                expected=expected,
                devices=launch.devices,
            )
            for index, launch in enumerate(launches)
        ]

    def _plan_sim_replicas(self) -> list[ProcessPlan]:
        check_free_memory(SIM_ENGINE_HOST_GB * self.spec.replicas, self.spec.replicas)
        expected = ExpectedConfig(
            served_model_name=self.served_model_name,
            max_model_len=self.spec.engine_args.max_model_len,
            expects_images=None,
        )
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.spec.env}
        return [
            ProcessPlan(
                role="replica",
                index=index,
                argv=sim_engine_argv(self.spec, port, seed=index),
                env=env,
                host=self.spec.replica_host,
                port=port,
                log_path=self.log_dir / f"replica-{index}.log",
                expected=expected,
                devices="sim",
            )
            for index, port in enumerate(self.spec.replica_ports())
        ]

    def _plan_gateway(self) -> ProcessPlan | None:
        if not self.spec.gateway:
            return None
        if not gateway_available():
            self.gateway_note = "gateway unavailable (the `vlmserve gateway` command is not installed); replicas are served directly"
            self.notes.append(self.gateway_note)
            return None
        check_gateway_policy(self.spec.gateway_policy)
        check_gateway_files(self.spec)
        return ProcessPlan(
            role="gateway",
            index=0,
            argv=gateway_argv(self.spec, self.replica_urls),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            host=self.spec.host,
            port=self.spec.port,
            log_path=self.log_dir / "gateway.log",
            expected=None,
            scheme="https" if self.spec.ssl_certfile else "http",
        )

    # ---- starting one process ---------------------------------------------------------

    def _start_and_wait(self, member: ManagedProcess, *, first_start: bool) -> None:
        """Start the process and wait until it is ready and verified; UserError if not."""
        plan = member.plan
        with self._lock:
            if self._stopping.is_set():
                raise ReadinessAborted("stopping")
            member.state = "starting" if first_start else "restarting"
            header = f"=== vlmserve: starting {plan.label} at {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(plan.argv)}"
            member.process = processes.start_process_group(plan.argv, plan.env, plan.log_path, header=header)
            member.pid_created_at = processes.created_at(member.process.pid)
            member.started_at = time.time()
            member.ready_at = None
            self._write_state()
        self._event(f"starting {plan.label} on port {plan.port} (pid {member.pid}, log {plan.log_path})")
        process = member.process
        try:
            if plan.expected is None:
                served = None
                _wait_for_health(plan.url, self.spec.ready_timeout_s, lambda: self._keep_waiting(process))
            else:
                served = wait_until_ready(
                    plan.url,
                    plan.expected,
                    timeout_s=self.spec.ready_timeout_s,
                    keep_waiting=lambda: self._keep_waiting(process),
                )
            self._verify_owner(member)
            if served is not None and plan.expected is not None:
                problems = config_mismatches(served, plan.expected)
                if problems:
                    raise StaleReplica("; ".join(problems))
        except ReadinessAborted:
            if self._stopping.is_set():
                raise
            raise UserError(self._start_failure_message(member)) from None
        except TimeoutError as last_problem:
            raise UserError(
                f"{plan.label} did not become ready within {self.spec.ready_timeout_s:.0f} s "
                f"(last check: {last_problem}); see its log {plan.log_path}"
            ) from None
        except StaleReplica as problem:
            raise UserError(
                f"{plan.label} on port {plan.port} serves another configuration ({problem}); a stale engine may "
                f"hold the port: stop it and retry"
            ) from None
        with self._lock:
            member.served = served
            member.state = "ready"
            member.ready_at = time.time()
            self._write_state()
        took = member.ready_at - (member.started_at or member.ready_at)
        detail = f", max_model_len {served.max_model_len}, engine {served.engine_version}" if served else ""
        self._event(f"{plan.label} ready at {plan.url} after {took:.0f} s{detail}")

    def _keep_waiting(self, process: subprocess.Popen[bytes]) -> bool:
        return not self._stopping.is_set() and process.poll() is None

    def _verify_owner(self, member: ManagedProcess) -> None:
        """The port must be answered by the process tree we started, not by a leftover."""
        assert member.process is not None
        listeners = processes.port_listeners(member.plan.port)
        if not listeners:
            return  # the OS would not tell us; the configuration check still runs
        ours = set(processes.tree_pids(member.process.pid))
        strangers = [pid for pid in listeners if pid not in ours]
        if strangers and not ours.intersection(listeners):
            raise StaleReplica(
                f"port {member.plan.port} is answered by {processes.describe_pid(strangers[0])}, "
                "not by the engine vlmserve started"
            )

    def _start_failure_message(self, member: ManagedProcess) -> str:
        """One line that says what failed and where the log is, then the log's last lines."""
        assert member.process is not None
        code = member.process.poll()
        tail = processes.log_tail(member.plan.log_path, lines=12)
        telling = next(
            (line for line in reversed(tail) if "Error" in line or "error:" in line.lower()), tail[-1] if tail else ""
        )
        what = f"{member.plan.label} engine" if member.plan.role == "replica" else member.plan.label
        summary = (
            f"{what} exited with code {code} during start-up: {telling.strip()[:300]} "
            f"(full log: {member.plan.log_path})"
        )
        if tail:
            summary += "\n  last lines of the log:\n" + "\n".join(f"    {line[:300]}" for line in tail)
        return summary

    # ---- watching and restarting ------------------------------------------------------

    def _monitor_loop(self) -> None:
        while not self._stopping.wait(MONITOR_POLL_S):
            members = list(self.replicas) + ([self.gateway] if self.gateway else [])
            for member in members:
                if self._stopping.is_set():
                    return
                self._check_member(member)

    def _check_member(self, member: ManagedProcess) -> None:
        now = time.time()
        if member.state == "ready" and member.process is not None:
            code = member.process.poll()
            if code is None:
                if member.ready_at and now - member.ready_at > STABLE_AFTER_S:
                    member.backoff_s = BACKOFF_START_S
                return
            processes.stop_process_tree(member.process, grace_s=2.0)  # reap anything it left
            with self._lock:
                member.last_exit_code = code
                member.last_restart_reason = member.kill_reason or f"exited with code {code}"
                member.kill_reason = None
                member.state = "restarting"
                member.restart_at = now + member.backoff_s
                self._write_state()
            self._event(
                f"{member.plan.label} (pid {member.pid}) {member.last_restart_reason}; "
                f"restarting in {member.backoff_s:.0f} s (restart {member.restarts + 1})"
            )
            return
        if member.state in ("restarting", "failed") and member.restart_at is not None and now >= member.restart_at:
            member.restarts += 1
            member.restart_at = None
            try:
                self._start_and_wait(member, first_start=False)
            except ReadinessAborted:
                return
            except UserError as problem:
                if member.process is not None:
                    processes.stop_process_tree(member.process, grace_s=5.0)
                member.backoff_s = min(BACKOFF_MAX_S, member.backoff_s * 2)
                with self._lock:
                    member.state = "failed"
                    member.restart_at = time.time() + member.backoff_s
                    self._write_state()
                first_line = problem.message.splitlines()[0]
                self._event(f"restart of {member.plan.label} failed: {first_line}; next try in {member.backoff_s:.0f} s")
                return
            member.backoff_s = min(BACKOFF_MAX_S, member.backoff_s * 2)

    def _watch(self, member: ManagedProcess) -> LivenessWatch:
        """A liveness watch on one replica; it sees the replica only while it is ready."""

        def subject() -> Subject | None:
            with self._lock:
                if member.state != "ready" or member.process is None or member.plan.expected is None:
                    return None
                return Subject(member.plan.url, member.plan.expected.served_model_name, member.process)

        def on_hung(process: object, reason: str) -> None:
            self._kill_hung(member, process, reason)

        return LivenessWatch(member.plan.label, subject, on_hung, self.spec.liveness, self._stopping)

    def _kill_hung(self, member: ManagedProcess, process: object, reason: str) -> None:
        """SIGKILL a hung replica's whole process group; the monitor then restarts it as after a crash."""
        with self._lock:
            if self._stopping.is_set() or member.process is not process or member.state != "ready":
                return  # restarted or stopping meanwhile: the verdict is about a process that is gone
            if member.process.poll() is not None:
                return
            member.kill_reason = reason
            self._event(f"{member.plan.label} (pid {member.pid}) is {reason}; killing its process group")
            processes.kill_process_tree(member.process)

    # ---- bookkeeping ------------------------------------------------------------------

    def _write_state(self) -> None:
        write_state(self.state_dir / "state.json", self.status())

    def _event(self, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        line = f"{stamp} {message}"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / "supervisor.log", "a") as log:
            log.write(f"{time.strftime('%Y-%m-%d')} {line}\n")
        if self._on_event is not None:
            self._on_event(line)


def _wait_for_health(url: str, timeout_s: float, keep_waiting: Callable[[], bool]) -> None:
    """Readiness for the gateway: GET /health is 200."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while True:
        if not keep_waiting():
            raise ReadinessAborted(last)
        try:
            # our own gateway, maybe with a self-signed certificate: the check is "it answers"
            reply = httpx.get(f"{url}/health", timeout=5, trust_env=False, verify=False)
            if reply.status_code == 200:
                return
            last = f"/health answered {reply.status_code}"
        except httpx.TransportError as problem:
            last = f"{type(problem).__name__}"
        if time.monotonic() >= deadline:
            raise TimeoutError(last)
        time.sleep(0.3)


def member_label(member: dict[str, Any]) -> str:
    """'replica 0' or 'gateway', from a member's entry in a state file."""
    return f"replica {member.get('index')}" if member.get("role") == "replica" else str(member.get("role"))


def living_members(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Members of a state file whose recorded process still runs: the same pid *and* the same
    start time (a pid reused by another program since is not ours)."""
    members = list(state.get("replicas") or []) + ([state["gateway"]] if state.get("gateway") else [])
    return [
        member
        for member in members
        if member.get("pid") and processes.matches_recorded(int(member["pid"]), member.get("pid_created_at"))
    ]


def _expected_cache_labels(spec: DeploymentSpec) -> dict[str, str]:
    """cache_config_info labels the spec pins down (compared after start)."""
    labels: dict[str, str] = {}
    if spec.engine_args.enable_prefix_caching is not None:
        labels["enable_prefix_caching"] = str(spec.engine_args.enable_prefix_caching)
    if spec.engine_args.kv_cache_dtype is not None:
        labels["cache_dtype"] = spec.engine_args.kv_cache_dtype
    return labels


def sim_engine_argv(spec: DeploymentSpec, port: int, seed: int = 0) -> list[str]:
    """`python -m vlmserve engine sim ...` for one simulated replica."""
    from vlmserve.engines.vllm import served_model_name

    argv = [
        sys.executable, "-m", "vlmserve", "engine", "sim",
        "--host", spec.replica_host, "--port", str(port), "--model", served_model_name(spec), "--seed", str(seed),
    ]  # fmt: skip
    args = spec.engine_args
    for flag, value in (
        ("--max-model-len", args.max_model_len),
        ("--max-num-seqs", args.max_num_seqs),
        ("--max-num-batched-tokens", args.max_num_batched_tokens),
        ("--profile", spec.sim.profile),
        ("--ttft-ms", spec.sim.ttft_ms),
        ("--itl-ms", spec.sim.itl_ms),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return argv + list(spec.sim.extra_args)


def gateway_available() -> bool:
    """Is the `vlmserve gateway` command registered in this install?"""
    return "gateway" in registered_verbs()


def check_gateway_policy(policy: str) -> None:
    """Refuse an unknown routing policy before any engine starts (not a minute later)."""
    try:
        from vlmserve.gateway.config import POLICY_NAMES
    except ImportError:
        return  # the gateway checks it itself when it starts
    if policy not in POLICY_NAMES:
        raise UserError(f"gateway_policy '{policy}' is unknown; choose one of {', '.join(POLICY_NAMES)}")


def registered_verbs() -> set[str]:
    """Top-level verbs this install offers, registered into a throwaway app (the real one is
    left as it is, so calling this from inside the CLI does not register anything twice)."""
    import importlib

    import typer
    import typer.main

    from vlmserve.cli.app import VERB_MODULES

    probe = typer.Typer()
    for module_name in VERB_MODULES:
        try:
            importlib.import_module(module_name).register(probe)
        except ImportError:
            continue  # a verb package that is not installed is simply not offered
    group = typer.main.get_command(probe)
    return set(getattr(group, "commands", {}))


def looks_like_path(model: str) -> bool:
    """'/x', './x', '~/x', 'x/' or an existing path are paths; 'org/name' is a hub id."""
    return model.startswith(("/", "./", "../", "~")) or model.endswith("/") or os.path.exists(model)


def resolve_model_path(model: str, on_event: EventSink | None = None) -> str:
    """The directory or hub id the engine loads; makes the embedded model on first use."""
    from vlmserve.engines.embedded import ensure_tiny_model, is_complete, tiny_model_path

    if model == EMBEDDED_MODEL:
        if not is_complete(tiny_model_path()) and on_event is not None:
            on_event("making the embedded tiny VLM (first use; a few seconds)")
        return str(ensure_tiny_model())
    if looks_like_path(model):
        path = Path(model).expanduser().resolve()
        if not path.exists():
            raise UserError(f"model path {path} does not exist; give a model directory or a hub id like org/name")
        if not path.is_dir() or not (path / "config.json").is_file():
            raise UserError(f"model path {path} has no config.json; point --model at a Hugging Face model directory")
        return str(path)
    return model


def model_expects_images(model: str, model_path: str) -> bool | None:
    """True for a VLM, False for a text-only model, None when we cannot tell before it starts."""
    if model == EMBEDDED_MODEL:
        return True
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model_path, "config.json")
        except Exception:  # no hub library or a malformed id: decide after start
            cached = None
        if not isinstance(cached, str):
            return None
        config_file = Path(cached)
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return "vision_config" in config or "vision_tower" in json.dumps(config)


def check_free_memory(needed_gb: float, replicas: int) -> None:
    """Refuse to start when the replicas would not fit in the memory free now."""
    available_gb = psutil.virtual_memory().available / 1e9
    if needed_gb > available_gb:
        raise UserError(
            f"not enough free memory: {replicas} replica(s) need about {needed_gb:.1f} GB but "
            f"{available_gb:.1f} GB is available; lower --replicas or kv_cache_space_gb, or free memory"
        )
