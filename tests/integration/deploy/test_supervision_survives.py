"""Supervision under `vlmserve up` survives what used to end it or fool it.

Real processes throughout: `vlmserve up --engine sim` (sim replicas and the real gateway), a
real full file system (a small tmpfs, filled until the kernel answers ENOSPC), real signals.

- With the state directory full, a killed replica and then a killed gateway are restarted;
  `status` says the state could not be saved (once in the log, not once per retry); freeing the
  space saves the state again and clears the alarm.
- A gateway that stops answering (SIGSTOP) is killed and restarted, and clients are answered again.
- A replica whose /health answers while its engine loop is frozen with requests waiting is
  killed and restarted.
- An exception in a monitor step is reported and supervision goes on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.test_supervisor import cli_env, read_state, sim_available, spawn_up, wait_for
from tests.e2e.test_supervisor import home as home  # noqa: F401  (fixture)
from tests.e2e.test_supervisor import up_process as up_process  # noqa: F401  (fixture)
from tests.helpers.procs import free_ports
from tests.integration.deploy.small_filesystem import fill, small_filesystem
from tests.integration.test_up_trust_boundary import read_until, ready_with_gateway, stop_up, write_spec
from vlmserve.deploy.processes import port_listeners

needs_sim = pytest.mark.skipif(not sim_available(), reason="`vlmserve engine sim` is not registered")

FAST_LIVENESS = {"interval_s": 0.5, "timeout_s": 1.0, "failures": 3, "probe_timeout_s": 1.0}


def ask(endpoint: str, timeout_s: float = 30.0) -> httpx.Response:
    return httpx.post(
        f"{endpoint}/v1/chat/completions", timeout=timeout_s, trust_env=False,
        json={"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
    )  # fmt: skip


def status_of(vlmserve_cmd: list[str], home: Path, name: str, *flags: str) -> subprocess.CompletedProcess[str]:  # noqa: F811
    done = subprocess.run([*vlmserve_cmd, "status", name, *flags], capture_output=True, text=True, timeout=60,
                          env=cli_env(home))  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done


def answered_by_a_new_process(port: int, old_pid: int) -> bool:
    """Does a process other than `old_pid` (and none of a dead tree) listen on the port now?"""
    listeners = port_listeners(port)
    return bool(listeners) and old_pid not in listeners


@needs_sim
@pytest.mark.hostile(
    "the state directory is full (ENOSPC): a killed replica and gateway are restarted, "
    "status says the state could not be saved, freeing space clears it"
)
def test_a_full_state_directory_does_not_end_supervision(
    vlmserve_cmd: list[str],
    home: Path,
    tmp_path: Path,
    up_process: list[subprocess.Popen[str]],  # noqa: F811
) -> None:
    name = "fulldisk"
    state_dir = home / "deployments" / name
    spec = write_spec(tmp_path / "full.yaml", name=name, engine="sim", model="sim-model", replicas=1,
                      port=free_ports(2), liveness=FAST_LIVENESS)  # fmt: skip
    with small_filesystem(state_dir, size_kib=1024):
        proc = spawn_up(vlmserve_cmd, home, up_process, "-f", str(spec))
        state = wait_for(lambda: ready_with_gateway(home, name, 1), 180, "sim replica and gateway ready", proc)
        output = read_until(proc, "Ctrl-C stops everything", timeout_s=60)
        replica, gateway = state["replicas"][0], state["gateway"]
        filler = fill(state_dir)
        before_full = len(output)

        # (a) a crashed replica, then a crashed gateway: each restarted though nothing can be saved
        os.killpg(replica["pid"], signal.SIGKILL)
        output += read_until(proc, "replica 0 ready at", timeout_s=120)
        assert answered_by_a_new_process(replica["port"], replica["pid"])
        os.killpg(gateway["pid"], signal.SIGKILL)
        output += read_until(proc, "gateway ready at", timeout_s=120)
        assert answered_by_a_new_process(gateway["port"], gateway["pid"])
        answered = [ask(state["endpoint"]).status_code for _ in range(20)]  # through the new gateway, the new replica
        assert answered == [200] * 20, answered
        assert "could not save the deployment state" in output and "No space left on device" in output, output

        shown = status_of(vlmserve_cmd, home, name).stdout
        assert "state could not be saved since" in shown and "No space left on device" in shown, shown
        assert shown.count("unknown (recorded pid gone") == 2, shown  # both recorded pids are dead: not 'ready'
        as_json = json.loads(status_of(vlmserve_cmd, home, name, "--json").stdout)[0]
        assert as_json["alarm"].startswith("state could not be saved since"), as_json
        saved = read_state(home, name)
        assert saved is not None and saved["replicas"][0]["pid"] == replica["pid"]  # the old file, whole

        # (b) space returns: the next write saves what runs now, and the alarm is gone
        filler.unlink()

        def saved_again() -> dict | None:  # type: ignore[type-arg]
            now = read_state(home, name)
            return (
                now if now and now["replicas"][0]["pid"] != replica["pid"] and now["gateway"]["pid"] != gateway["pid"] else None
            )

        state = wait_for(saved_again, 60, "the state to be saved again", proc)
        assert state["replicas"][0]["restarts"] == 1 and state["gateway"]["restarts"] == 1, state
        assert {state["replicas"][0]["state"], state["gateway"]["state"]} == {"ready"}
        assert state["save_failures"] >= 2 and "No space left on device" in state["last_save_error"], state
        assert not (state_dir / "state.unsaved").exists()
        shown = status_of(vlmserve_cmd, home, name).stdout
        assert "could not be saved" not in shown and "stale" not in shown and shown.count("ready") == 2, shown
        output += stop_up(proc)
    # one line for the whole episode, however many writes failed (a retry every 2 s), and one when it
    # ended; besides, only the kills' own events (and at most one line saying supervisor.log cannot be appended to)
    assert output.count("could not save the deployment state") == 1, output
    assert output.count("deployment state saved again after") == 1, output
    episode = output[before_full : output.index("deployment state saved again after")].splitlines()
    assert sum("cannot append to" in line for line in episode) <= 1, episode  # a log whose last page has room takes a line or two
    assert len(episode) <= 12, episode


@needs_sim
@pytest.mark.hostile(
    "the gateway is stopped (SIGSTOP) under `up`: its silent /health gets it killed and "
    "restarted, the waiting client is let go, and clients are answered again"
)
def test_a_stopped_gateway_is_restarted(
    vlmserve_cmd: list[str],
    home: Path,
    tmp_path: Path,
    up_process: list[subprocess.Popen[str]],  # noqa: F811
) -> None:
    name = "stoppedgw"
    spec = write_spec(tmp_path / "gw.yaml", name=name, engine="sim", model="sim-model", replicas=1,
                      port=free_ports(2), liveness=FAST_LIVENESS)  # fmt: skip
    proc = spawn_up(vlmserve_cmd, home, up_process, "-f", str(spec))
    state = wait_for(lambda: ready_with_gateway(home, name, 1), 180, "sim replica and gateway ready", proc)
    output = read_until(proc, "Ctrl-C stops everything", timeout_s=60)
    gateway = state["gateway"]
    assert ask(state["endpoint"]).status_code == 200
    os.killpg(gateway["pid"], signal.SIGSTOP)
    try:
        # a client that arrives now is accepted by the kernel and waits; the kill must let it go
        # (an error it can retry), long before its own generous timeout
        with pytest.raises(httpx.TransportError) as waited:
            ask(state["endpoint"], timeout_s=120)
        assert not isinstance(waited.value, httpx.TimeoutException), waited.value
        output += read_until(proc, "gateway ready at", timeout_s=120)
    finally:
        if psutil.pid_exists(gateway["pid"]):
            os.killpg(gateway["pid"], signal.SIGCONT)  # a failed test must not leave a stopped process
    assert f"gateway (pid {gateway['pid']}) is hung: no answer to /health in 1 s ×3" in output, output
    assert ask(state["endpoint"]).status_code == 200
    now = wait_for(lambda: (s := read_state(home, name)) and s["gateway"]["restarts"] == 1 and
                   s["gateway"]["state"] == "ready" and s, 60, "the gateway's restart recorded", proc)  # fmt: skip
    assert now["gateway"]["last_exit_code"] == -signal.SIGKILL
    assert now["gateway"]["last_restart_reason"].startswith("hung: no answer to /health"), now["gateway"]
    assert now["replicas"][0]["restarts"] == 0
    stop_up(proc)


@needs_sim
@pytest.mark.hostile(
    "a replica's engine loop freezes with requests waiting while its /health still answers: restarted, the reason logged"
)
def test_a_replica_stuck_behind_a_healthy_api_is_restarted(
    vlmserve_cmd: list[str],
    home: Path,
    tmp_path: Path,
    up_process: list[subprocess.Popen[str]],  # noqa: F811
) -> None:
    name = "stuck"
    # readiness sends two 1-token generations (text, image); the third request freezes the loop
    spec = write_spec(tmp_path / "stuck.yaml", name=name, engine="sim", model="sim-model", replicas=1,
                      port=free_ports(2), sim={"extra_args": ["--freeze-after", "2"]},
                      liveness={**FAST_LIVENESS, "stall_s": 2.0})  # fmt: skip
    proc = spawn_up(vlmserve_cmd, home, up_process, "-f", str(spec))
    state = wait_for(lambda: ready_with_gateway(home, name, 1), 180, "sim replica and gateway ready", proc)
    output = read_until(proc, "Ctrl-C stops everything", timeout_s=60)
    replica = state["replicas"][0]
    # the request that freezes it waits for ever on the engine; /health keeps answering 200
    with pytest.raises(httpx.TransportError) as waited:
        ask(replica["url"], timeout_s=120)
    assert not isinstance(waited.value, httpx.TimeoutException), waited.value  # let go by the kill
    output += read_until(proc, "replica 0 ready at", timeout_s=120)
    assert f"replica 0 (pid {replica['pid']}) is stalled: 1 waiting and 0 running, no prompt or generation token" in output, (
        output
    )
    now = wait_for(lambda: (s := read_state(home, name)) and s["replicas"][0]["restarts"] == 1 and
                   s["replicas"][0]["state"] == "ready" and s, 60, "the replica's restart recorded", proc)  # fmt: skip
    assert now["replicas"][0]["last_restart_reason"].startswith("stalled: 1 waiting"), now["replicas"][0]
    assert now["replicas"][0]["last_exit_code"] == -signal.SIGKILL
    assert now["gateway"]["restarts"] == 0
    stop_up(proc)


def flaky_supervisor(spec: object, state_dir: Path, events: list[str], faults: int):  # type: ignore[no-untyped-def]
    """A Supervisor whose monitor step raises for its first `faults` runs: a bug's exception, injected
    where any surprise would surface (the step that restarts crashed processes)."""
    from vlmserve.deploy.supervisor import Supervisor

    class Flaky(Supervisor):
        faults_left = faults

        def _check_member(self, member):  # type: ignore[no-untyped-def]
            if self.faults_left > 0:
                self.faults_left -= 1
                raise RuntimeError("injected fault in the monitor step")
            super()._check_member(member)

    return Flaky(spec, on_event=events.append, state_dir=state_dir)  # type: ignore[arg-type]


@needs_sim
@pytest.mark.hostile(
    "an exception in the supervisor's monitor step: reported once, supervision goes on and a crashed replica is still restarted"
)
def test_an_exception_in_the_monitor_does_not_end_supervision(tmp_path: Path) -> None:
    from vlmserve.spec import DeploymentSpec

    spec = DeploymentSpec(name="flaky", engine="sim", model="sim-model", replicas=1, gateway=False,
                          port=free_ports(2), liveness={"enabled": False})  # fmt: skip
    events: list[str] = []
    supervisor = flaky_supervisor(spec, tmp_path, events, faults=8)  # four seconds of failing passes
    with supervisor:
        replica = supervisor.replicas[0]
        first_pid = replica.pid
        assert first_pid is not None
        wait_for(lambda: supervisor.faults_left == 0, 60, "the injected faults to be spent")
        os.killpg(first_pid, signal.SIGKILL)
        wait_for(lambda: replica.restarts == 1 and replica.state == "ready", 120, "the replica to be restarted")
        assert replica.pid != first_pid and ask(replica.plan.url).status_code == 200
    failed = [line for line in events if "supervision step 'check replica 0' failed" in line]
    assert len(failed) == 1, events  # eight failures, one line
    assert "RuntimeError: injected fault in the monitor step; supervision goes on" in failed[0]
    assert any("supervision step 'check replica 0' works again" in line for line in events), events
    assert any(f"replica 0 (pid {first_pid}) exited with code -9; restarting" in line for line in events), events
