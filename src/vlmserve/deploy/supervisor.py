"""Start, ready-check, verify, restart and stop the processes of one deployment.

`Supervisor(spec)` turns a DeploymentSpec into running engine replicas (whatever the spec's
`EngineLauncher` starts: vLLM or the simulated engine) and, when asked, the gateway in front:

- Checks first, before anything starts (vlmserve.deploy.preflight): the model exists, the
  ports are free, there is enough free memory, and no other supervisor runs a deployment of
  the same name.
- GPU replicas start one at a time: two vLLM engines profiling GPU memory at once is a known
  cause of start-up failures. CPU and sim replicas start together (`STARTS_TOGETHER`): a CPU
  engine's KV cache is the fixed VLLM_CPU_KVCACHE_SPACE and the preflight has checked that
  every replica fits in memory, so there is no race; the sim profiles nothing. Each must pass
  the readiness checks and serve the configuration its launcher expects, from a process
  vlmserve itself started (vlmserve.deploy.startup).
- A replica that dies is restarted with exponential back-off, and the event is logged.
  One that hangs (no answer to /health, then none to a 1-token generation; or requests waiting
  while its engine processes no token; see vlmserve.deploy.liveness) is killed outright and
  restarted the same way, with the reason recorded. So is a gateway that stops answering /health.
- Nothing ends supervision but stop(): every step of the monitor runs guarded
  (vlmserve.deploy.guard), and state.json is saved by a `StateSaver` that turns a failed write (a
  full disk) into an alarm `status` shows, while supervision goes on from memory.
- A name whose previous supervisor is gone but whose processes still run is refused (the
  state file that lets `vlmserve down` find them is never overwritten).
- The trust boundary: with a gateway in front, replicas listen on loopback only; a host
  reachable from other machines needs a keys file or an explicit `open: true`.
- `stop()` (also on leaving the `with` block) stops every process tree it started.
- With `autoscale:` in the spec, every replica up to the rule's maximum is planned (ports, logs,
  memory checked) but only the starting count runs; the gateway reads its members from a file
  this supervisor rewrites (`members_file`), and `vlmserve.deploy.autoscaler` starts and retires
  the others as the rule decides.

It is a library object (used by `vlmserve up`, `vlmserve demo` and `sweep`); signal handling
belongs to the command that owns the terminal.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from vlmserve import paths
from vlmserve.deploy import processes
from vlmserve.deploy.cold_start import cold_start_phases, log_size
from vlmserve.deploy.front_door import check_gateway_files, check_trust_boundary
from vlmserve.deploy.guard import StepGuard
from vlmserve.deploy.liveness import LivenessWatch, Subject
from vlmserve.deploy.members import BACKOFF_MAX_S, BACKOFF_START_S, STABLE_AFTER_S, ManagedProcess, ProcessState
from vlmserve.deploy.members_file import DISCOVER_INTERVAL_S, MEMBERS_FILE, check_autoscale, write_members_file
from vlmserve.deploy.plan import gateway_plan, replica_plans
from vlmserve.deploy.preflight import check_free_memory, check_gateway_policy, check_ports, refuse_running_duplicate
from vlmserve.deploy.readiness import ReadinessAborted
from vlmserve.deploy.startup import await_ready
from vlmserve.deploy.state import DeploymentState, member_list
from vlmserve.deploy.state_saver import StateSaver
from vlmserve.engines.launcher import make_launcher, served_model_name
from vlmserve.errors import UserError
from vlmserve.spec import DeploymentSpec

MONITOR_POLL_S = 0.5

STARTS_TOGETHER = frozenset({"cpu", "sim"})
"""Device kinds whose replicas start at once (a GPU engine sizes its KV cache from the free GPU
memory it measures, so two starting together can each see the other's allocations)."""

EventSink = Callable[[str], None]

if TYPE_CHECKING:
    from vlmserve.deploy.autoscaler import Autoscaler


class Supervisor:
    """Runs one deployment; `with Supervisor(spec) as sup:` starts it and stops it on exit."""

    def __init__(self, spec: DeploymentSpec, *, on_event: EventSink | None = None, state_dir: Path | None = None) -> None:
        """state_dir: where state.json, supervisor.log and logs/ go (default
        $VLMSERVE_HOME/deployments/<name>; tests pass a temporary directory)."""
        self.spec = spec
        self._on_event = on_event
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None
        self._heartbeat: threading.Thread | None = None
        self._watches: list[LivenessWatch] = []
        self.replicas: list[ManagedProcess] = []
        self.gateway: ManagedProcess | None = None
        self.device_kind: str = "sim" if spec.engine == "sim" else "unknown"
        self.model_path: str = spec.model
        self.notes: list[str] = []
        self.started_at = time.time()
        self.state_dir = Path(state_dir) if state_dir is not None else paths.deployment_dir(spec.name)
        self.log_dir = Path(spec.log_dir).expanduser() if spec.log_dir else self.state_dir / "logs"
        self._saver = StateSaver(self.state_dir / "state.json", self._event)
        self._guard = StepGuard(self._event)
        self._event_log_problem: str | None = None
        """Why supervisor.log could not be appended to, while it cannot (said once on the console)."""
        self.members_file = self.state_dir / MEMBERS_FILE
        """With autoscale: the replica URLs the gateway routes to (its --discover file)."""
        self.autoscaler: Autoscaler | None = None

    # ---- public surface -------------------------------------------------------------

    @property
    def served_model_name(self) -> str:
        return served_model_name(self.spec)

    @property
    def members(self) -> list[ManagedProcess]:
        """Every replica, then the gateway when there is one."""
        return member_list(self.replicas, self.gateway)

    @property
    def replica_urls(self) -> list[str]:
        return [replica.plan.url for replica in self.replicas]

    @property
    def endpoint(self) -> str:
        """Where clients go: the gateway when the deployment has one (also while it restarts or
        stops: a replica's URL would invite clients around admission), else the first replica."""
        if self.gateway is not None:
            return self.gateway.plan.url
        return self.replica_urls[0]

    @property
    def stopping(self) -> bool:
        """True once stop() was asked for (the CLI's wait loop ends on it)."""
        return self._stopping.is_set()

    def __enter__(self) -> "Supervisor":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> "Supervisor":
        """Check, then start every replica (GPU ones one at a time), then the gateway; return when ready."""
        try:
            self._preflight()
            self._write_state()
            self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="vlmserve-state", daemon=True)
            self._heartbeat.start()
            starting = self._first_replicas()
            if self.device_kind in STARTS_TOGETHER:
                for replica in starting:
                    self._launch(replica, first_start=True)
                for replica in starting:
                    self._await(replica)
            else:
                for replica in starting:
                    self._start_and_wait(replica, first_start=True)
            if self.spec.autoscale is not None:
                self.publish_members()
            if self.gateway is not None:
                self._start_and_wait(self.gateway, first_start=True)
        except BaseException:
            self.stop()
            raise
        self._monitor = threading.Thread(target=self._monitor_loop, name="vlmserve-supervisor", daemon=True)
        self._monitor.start()
        if self.spec.liveness.enabled:
            self._watches = [self._watch(member) for member in self.members]
            for watch in self._watches:
                watch.start()
        if self.spec.autoscale is not None:
            from vlmserve.deploy.autoscaler import Autoscaler

            self.autoscaler = Autoscaler(self, self.spec.autoscale, say=self._event)
            self.autoscaler.start()
        return self

    def _first_replicas(self) -> list[ManagedProcess]:
        """The replicas started with the deployment: all, or with autoscale the spec's count
        within the rule's bounds (the others wait as standby, planned but not running)."""
        rule = self.spec.autoscale
        if rule is None:
            return self.replicas
        count = max(rule.min_replicas, min(rule.max_replicas, self.spec.replicas))
        for replica in self.replicas[count:]:
            replica.state = "standby"
        return self.replicas[:count]

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until stop() is called (or timeout_s passes)."""
        self._stopping.wait(timeout_s)

    def stop(self) -> None:
        """Stop every process tree this supervisor started, gateway first; idempotent."""
        self._stopping.set()
        if self.autoscaler is not None:
            self.autoscaler.join()
        for thread in (self._monitor, self._heartbeat):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=30)
        for watch in self._watches:
            watch.join(timeout=self.spec.liveness.timeout_s + self.spec.liveness.probe_timeout_s + 1)
        with self._lock:
            for member in reversed(self.members):
                if member.state == "stopped" or (member.state == "standby" and member.process is None):
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

    def status(self) -> DeploymentState:
        """The state written to state.json."""
        with self._lock:
            return DeploymentState(
                name=self.spec.name,
                engine=self.spec.engine,
                model=self.spec.model,
                model_path=self.model_path,
                served_model_name=self.served_model_name,
                device_kind=self.device_kind,
                supervisor_pid=os.getpid(),
                supervisor_started_at=psutil.Process().create_time(),
                started_at=self.started_at,
                updated_at=time.time(),
                endpoint=self.endpoint if self.replicas else None,
                open=self.is_open,
                notes=list(self.notes),
                replicas=[replica.record() for replica in self.replicas],
                gateway=self.gateway.record() if self.gateway else None,
                spec=self.spec.model_dump(mode="json"),
                autoscale=self.autoscaler.summary() if self.autoscaler is not None else None,
            )

    @property
    def is_open(self) -> bool:
        """Does the front door serve anyone who can reach it (no keys asked)?"""
        return self.gateway is None or not self.spec.keys_file

    # ---- checks before anything starts ------------------------------------------------

    def _preflight(self) -> None:
        spec = self.spec
        refuse_running_duplicate(spec.name, self.state_dir / "state.json")
        check_trust_boundary(spec, gateway_runs=spec.gateway)
        check_autoscale(spec)
        planned = spec if spec.autoscale is None else spec.model_copy(update={"replicas": spec.autoscale.max_replicas})
        launcher = make_launcher(planned, on_event=self._event)
        self.model_path, self.device_kind = launcher.model_path, launcher.device_kind
        plans, notes = replica_plans(launcher, self.log_dir)
        self.notes.extend(notes)
        check_free_memory(launcher.host_memory_needed_gb(), planned.replicas)
        check_ports(spec.replica_host, [plan.port for plan in plans])
        self.replicas = [ManagedProcess(plan=plan) for plan in plans]
        if spec.gateway:
            check_gateway_policy(spec.gateway_policy)
            check_gateway_files(spec)
            if spec.autoscale is None:
                plan = gateway_plan(spec, self.replica_urls, self.log_dir, self.model_path)
            else:  # members come and go: the gateway reads them from the file this supervisor rewrites
                discovering = spec.model_copy(update={"gateway_discover": f"file:{self.members_file}"})
                plan = gateway_plan(discovering, [], self.log_dir, self.model_path, discover_interval_s=DISCOVER_INTERVAL_S)
            check_ports(spec.host, [plan.port])
            self.gateway = ManagedProcess(plan=plan)
        for note in self.notes:
            self._event(note)

    # ---- replicas that come and go (autoscale) -------------------------------------------

    def start_replica(self, member: ManagedProcess) -> None:
        """Start a standby replica and wait until it is ready and verified (UserError if not;
        ReadinessAborted on stop). Not yet in the gateway's members: see publish_members."""
        self._start_and_wait(member, first_start=True)

    def set_state(self, member: ManagedProcess, state: ProcessState) -> None:
        with self._lock:
            member.state = state
            self._write_state()

    def stop_replica(self, member: ManagedProcess) -> None:
        """Stop one replica's process tree for good (its last request has ended) and park it as standby."""
        with self._lock:
            process = member.process
        if process is not None:
            processes.stop_process_tree(process)
        with self._lock:
            if process is not None:
                member.last_exit_code = process.returncode
            member.process = None  # never signal this process group id again
            member.state = "standby"
            member.started_at = member.ready_at = None
            self._write_state()

    def publish_members(self, held_back: frozenset[int] = frozenset()) -> list[str]:
        """Rewrite the gateway's members file: every replica that serves or is being restarted
        (not standby, starting or draining), less the indices `held_back` (ready, not warmed yet).
        Returns the URLs written."""
        with self._lock:
            urls = [
                m.plan.url
                for m in self.replicas
                if m.state in ("ready", "restarting", "failed") and m.plan.index not in held_back
            ]
        write_members_file(self.members_file, urls)
        return urls

    # ---- starting one process ---------------------------------------------------------

    def _start_and_wait(self, member: ManagedProcess, *, first_start: bool) -> None:
        """Start the process and wait until it is ready and verified; UserError if not."""
        self._launch(member, first_start=first_start)
        self._await(member)

    def _launch(self, member: ManagedProcess, *, first_start: bool) -> None:
        """Start the member's process group (not waiting for it)."""
        plan = member.plan
        with self._lock:
            if self._stopping.is_set():
                raise ReadinessAborted("stopping")
            member.state = "starting" if first_start else "restarting"
            header = f"=== vlmserve: starting {plan.label} at {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(plan.argv)}"
            member.log_offset = log_size(plan.log_path)
            member.process = processes.start_process_group(plan.argv, plan.env, plan.log_path, header=header)
            member.pid_created_at = processes.created_at(member.process.pid)
            member.started_at = time.time()
            member.ready_at = None
            self._write_state()
        self._event(f"starting {plan.label} on port {plan.port} (pid {member.pid}, log {plan.log_path})")

    def _await(self, member: ManagedProcess) -> None:
        """Wait until the launched member is ready and verified; UserError if not."""
        plan, process = member.plan, member.process
        assert process is not None
        served = await_ready(member, self.spec.ready_timeout_s, lambda: self._keep_waiting(process), self._stopping.is_set)
        with self._lock:
            member.served = served
            member.state = "ready"
            member.ready_at = time.time()
            if plan.role == "replica":
                member.cold_start = cold_start_phases(
                    plan.log_path, member.log_offset, member.started_at or member.ready_at, member.ready_at
                )
            self._write_state()
        took = member.ready_at - (member.started_at or member.ready_at)
        detail = f", max_model_len {served.max_model_len}, engine {served.engine_version}" if served else ""
        self._event(f"{plan.label} ready at {plan.url} after {took:.0f} s{detail}")

    def _keep_waiting(self, process: subprocess.Popen[bytes]) -> bool:
        return not self._stopping.is_set() and process.poll() is None

    # ---- watching and restarting ------------------------------------------------------

    def _monitor_loop(self) -> None:
        """Check every member twice a second, restarting what died, until stop().

        Each step is guarded: an exception is reported and the next step runs (a monitor thread
        that died would leave every later crash unrestarted)."""
        while not self._stopping.wait(MONITOR_POLL_S):
            for member in self.members:
                if self._stopping.is_set():
                    return
                self._guard.run(f"check {member.plan.label}", lambda member=member: self._check_member(member))  # type: ignore[misc]

    def _heartbeat_loop(self) -> None:
        """Save the state when a heartbeat or a retry is due, until stop(). Its own thread: the
        monitor waits out a restarting replica's readiness (minutes for vLLM), and the state's age
        must not say "stale" meanwhile, nor a retry wait for it once space returns."""
        while not self._stopping.wait(MONITOR_POLL_S):
            if self._saver.due():
                self._guard.run("save state", self._write_state)

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
            except Exception as problem:  # noqa: BLE001 - UserError, or a surprise (OSError...): try again later
                if member.process is not None:
                    processes.stop_process_tree(member.process, grace_s=5.0)
                member.backoff_s = min(BACKOFF_MAX_S, member.backoff_s * 2)
                with self._lock:
                    member.state = "failed"
                    member.restart_at = time.time() + member.backoff_s
                    self._write_state()
                what = problem.message if isinstance(problem, UserError) else f"{type(problem).__name__}: {problem}"
                first_line = (what.splitlines() or [""])[0]
                self._event(f"restart of {member.plan.label} failed: {first_line}; next try in {member.backoff_s:.0f} s")
                return
            member.backoff_s = min(BACKOFF_MAX_S, member.backoff_s * 2)

    def _watch(self, member: ManagedProcess) -> LivenessWatch:
        """A liveness watch on one member (a replica, or the gateway on /health alone); it sees
        the member only while it is ready."""

        def subject() -> Subject | None:
            with self._lock:
                if member.state != "ready" or member.process is None:
                    return None
                if member.plan.expected is None:
                    return Subject(member.plan.url, "", member.process, role="gateway")
                return Subject(member.plan.url, member.plan.expected.served_model_name, member.process)

        def on_hung(process: object, reason: str) -> None:
            self._kill_hung(member, process, reason)

        return LivenessWatch(member.plan.label, subject, on_hung, self.spec.liveness, self._stopping, say=self._event)

    def _kill_hung(self, member: ManagedProcess, process: object, reason: str) -> None:
        """SIGKILL a hung replica's whole process group; the monitor then restarts it as after a crash."""
        with self._lock:
            if self._stopping.is_set() or member.process is not process or member.state != "ready":
                return  # restarted or stopping meanwhile: the verdict is about a process that is gone
            if process is None or process.poll() is not None:
                return
            member.kill_reason = reason
            self._event(f"{member.plan.label} (pid {member.pid}) is {reason}; killing its process group")
            processes.kill_process_tree(process)

    # ---- bookkeeping ------------------------------------------------------------------

    def _write_state(self) -> None:
        """Save the state; a failure is the saver's alarm (never an exception: supervision goes on)."""
        with self._lock:
            self._saver.save(self.status())

    @property
    def state_saved(self) -> bool:
        """False while state.json cannot be written (the saver's alarm is on)."""
        return not self._saver.failing

    def _event(self, message: str) -> None:
        """One line to supervisor.log and to the command's console. A log that cannot be written (a
        full disk) is said once on the console, and the lines go on reaching the console."""
        stamp = time.strftime("%H:%M:%S")
        line = f"{stamp} {message}"
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            with open(self.state_dir / "supervisor.log", "a") as log:
                log.write(f"{time.strftime('%Y-%m-%d')} {line}\n")
        except OSError as problem:
            if self._event_log_problem is None:
                self._event_log_problem = str(problem)
                self._console(
                    f"{stamp} cannot append to {self.state_dir / 'supervisor.log'} ({problem}); "
                    "events go to this console only until it can"
                )
        else:
            self._event_log_problem = None
        self._console(line)

    def _console(self, line: str) -> None:
        if self._on_event is not None:
            try:
                self._on_event(line)
            except Exception:  # noqa: BLE001, S110 - a closed terminal must not end supervision
                pass
