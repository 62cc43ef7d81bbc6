"""`vlmserve up` / `status`: bad input is one clear line; replicas serve, restart, and stop completely."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.helpers.procs import free_ports
from vlmserve.deploy.processes import port_is_free
from vlmserve.deploy.readiness import image_message, tiny_png_data_url


def registered_verbs() -> set[str]:
    """Top-level verbs this install offers, registered into a throwaway app."""
    import importlib

    import typer
    import typer.main

    from vlmserve.cli.app import VERB_MODULES

    probe = typer.Typer()
    for module_name in VERB_MODULES:
        importlib.import_module(module_name).register(probe)
    return set(getattr(typer.main.get_command(probe), "commands", {}))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def cli_env(home: Path) -> dict[str, str]:
    return {**os.environ, "VLMSERVE_HOME": str(home), "COLUMNS": "200"}


def run_up(vlmserve_cmd: list[str], home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*vlmserve_cmd, "up", *args], capture_output=True, text=True, timeout=timeout, env=cli_env(home))


def assert_one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    error_lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1, done.stderr
    for needle in needles:
        assert needle in done.stderr, (needle, done.stderr)


# ---- bad input: one line, exit 2, nothing started -----------------------------------


def test_model_path_that_does_not_exist(vlmserve_cmd: list[str], home: Path, tmp_path: Path) -> None:
    done = run_up(vlmserve_cmd, home, "--model", str(tmp_path / "no-such-model"))
    assert_one_line_error(done, f"model path {tmp_path / 'no-such-model'} does not exist")


def test_model_directory_without_config(vlmserve_cmd: list[str], home: Path, tmp_path: Path) -> None:
    (tmp_path / "empty-model").mkdir()
    done = run_up(vlmserve_cmd, home, "--model", str(tmp_path / "empty-model"))
    assert_one_line_error(done, "has no config.json")


def test_port_already_taken(vlmserve_cmd: list[str], home: Path) -> None:
    base = free_ports(3)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", base + 2))
        squatter.listen()
        done = run_up(vlmserve_cmd, home, "--engine", "sim", "--replicas", "2", "--port", str(base), "--no-gateway")
    assert_one_line_error(done, f"port {base + 2} on 127.0.0.1 is already in use", "choose another --port")


def test_not_enough_memory(vlmserve_cmd: list[str], home: Path) -> None:
    base = free_ports(3)
    done = run_up(vlmserve_cmd, home, "--replicas", "2", "--port", str(base), "--kv-cache-space-gb", "100000")
    assert_one_line_error(done, "not enough free memory: 2 replica(s) need about", "GB is available")


def test_malformed_spec_file(
    vlmserve_cmd: list[str], home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "deploy.yaml"
    spec.write_text("model: embedded\nreplicas: two\n")
    done = run_up(vlmserve_cmd, home, "-f", str(spec))
    assert_one_line_error(done, "deploy.yaml: field 'replicas'")
    # the same command through main() in this process: a second process would import vLLM (~8 s) to
    # build the parser this check uses; this process has it already in a suite run
    from vlmserve.cli.app import main

    spec.write_text("model: embedded\nengine_args:\n  max_num_seq: 4\n")
    monkeypatch.setenv("VLMSERVE_HOME", str(home))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["up", "-f", str(spec)])
    captured = capsys.readouterr()
    done = subprocess.CompletedProcess(["up"], exited.value.code, captured.out, captured.err)
    assert_one_line_error(done, "field 'engine_args.max_num_seq': not a flag of the installed vLLM; did you mean 'max_num_seqs'?")


def test_malformed_flags(vlmserve_cmd: list[str], home: Path) -> None:
    done = run_up(vlmserve_cmd, home, "--replicas", "0")
    assert_one_line_error(done, "flags: field 'replicas'")
    done = run_up(vlmserve_cmd, home, "--engine", "llama")
    assert_one_line_error(done, "--engine 'llama': use one of vllm, sim")


def test_unknown_gateway_policy(vlmserve_cmd: list[str], home: Path) -> None:
    done = run_up(vlmserve_cmd, home, "--engine", "sim", "--port", str(free_ports(2)), "--gateway-policy", "bogus")
    assert_one_line_error(done, "gateway_policy 'bogus' is unknown; choose one of round-robin")
    assert "starting replica" not in done.stdout  # refused before anything started


def test_malformed_json_flag(vlmserve_cmd: list[str], home: Path) -> None:
    done = run_up(vlmserve_cmd, home, "--limit-mm-per-prompt", "{image: 2", "--print-plan")
    assert_one_line_error(done, "--limit-mm-per-prompt: not valid JSON")


def test_status_of_unknown_deployment(vlmserve_cmd: list[str], home: Path) -> None:
    done = subprocess.run([*vlmserve_cmd, "status", "nope"], capture_output=True, text=True, timeout=120, env=cli_env(home))
    assert_one_line_error(done, "no deployment named 'nope'")
    done = subprocess.run([*vlmserve_cmd, "status"], capture_output=True, text=True, timeout=120, env=cli_env(home))
    assert done.returncode == 0 and "no deployments" in done.stdout


@pytest.mark.engine
def test_engine_that_fails_to_start(vlmserve_cmd: list[str], home: Path) -> None:
    base = free_ports(2)
    done = run_up(
        vlmserve_cmd, home, "--port", str(base), "--no-gateway", "--name", "broken",
        "--engine-arg=--no-such-engine-flag",
    )  # fmt: skip
    log = home / "deployments" / "broken" / "logs" / "replica-0.log"
    assert_one_line_error(done, "replica 0 engine exited with code", f"full log: {log}", "last lines of the log")
    assert "--no-such-engine-flag" in done.stderr  # the engine's own complaint, from its log
    assert log.is_file()
    assert port_is_free("127.0.0.1", base + 1)


# ---- a real 2-replica deployment: serves both, restarts a killed one, Ctrl-C stops all ----


def wait_for(condition, timeout_s: float, what: str, proc: subprocess.Popen[str] | None = None):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"`vlmserve up` exited ({proc.returncode}) while waiting for {what}: {proc.stdout.read() if proc.stdout else ''}"
            )
        time.sleep(0.1)  # the conditions read a state file or ask a local port: cheap; a
        # longer pause only adds its half on average to every wait (dozens of them in a suite run)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def read_state(home: Path, name: str) -> dict | None:  # type: ignore[type-arg]
    try:
        return json.loads((home / "deployments" / name / "state.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def all_ready(home: Path, name: str, count: int) -> dict | None:  # type: ignore[type-arg]
    state = read_state(home, name)
    if state and len(state["replicas"]) == count and all(r["state"] == "ready" for r in state["replicas"]):
        return state
    return None


def ask(base_url: str, model: str, with_image: bool) -> dict:  # type: ignore[type-arg]
    message = image_message("What is it?", tiny_png_data_url()) if with_image else {"role": "user", "content": "Hi"}
    reply = httpx.post(
        f"{base_url}/v1/chat/completions",
        json={"model": model, "messages": [message], "max_tokens": 4},
        timeout=120,
        trust_env=False,
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]


@pytest.fixture
def up_process(vlmserve_cmd: list[str], home: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Holds `vlmserve up` processes a test starts; kills their trees if the test fails midway."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait(timeout=30)


def spawn_up(vlmserve_cmd: list[str], home: Path, started: list[subprocess.Popen[str]], *args: str) -> subprocess.Popen[str]:
    """`vlmserve up ...` in the background (its output piped), remembered for clean-up."""
    proc = subprocess.Popen(
        [*vlmserve_cmd, "up", *args], env=cli_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    started.append(proc)
    return proc


@pytest.mark.engine
@pytest.mark.slow
def test_two_replicas_serve_restart_and_stop_cleanly(
    vlmserve_cmd: list[str], home: Path, up_process: list[subprocess.Popen[str]]
) -> None:
    base = free_ports(3)
    name = "two"
    proc = spawn_up(vlmserve_cmd, home, up_process, "--name", name, "--replicas", "2", "--port", str(base),
                    "--max-model-len", "1024", "--kv-cache-space-gb", "1")  # fmt: skip
    with_gateway = "gateway" in registered_verbs()

    def everything_ready() -> dict | None:  # type: ignore[type-arg]
        state = all_ready(home, name, 2)
        if state and (not with_gateway or (state["gateway"] and state["gateway"]["state"] == "ready")):
            return state
        return None

    state = wait_for(everything_ready, 480, "both replicas (and the gateway) ready", proc)

    # both replicas serve text and images, each on its own port and cores; so does the gateway
    for replica in state["replicas"]:
        assert ask(replica["url"], "embedded", with_image=False)["completion_tokens"] >= 1
        assert ask(replica["url"], "embedded", with_image=True)["prompt_tokens"] > 20
    assert {r["devices"] for r in state["replicas"]} == {"0", "1"}
    if with_gateway:
        assert state["endpoint"] == f"http://127.0.0.1:{base}"
        assert ask(state["endpoint"], "embedded", with_image=True)["prompt_tokens"] > 20
    else:
        assert "replicas are served directly" in state["gateway_note"]

    status = subprocess.run([*vlmserve_cmd, "status", name], capture_output=True, text=True, timeout=60, env=cli_env(home))
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("ready") == 2 + with_gateway and str(base + 1) in status.stdout and str(base + 2) in status.stdout

    # the same deployment name cannot be started twice
    again = run_up(vlmserve_cmd, home, "--name", name, "--port", str(free_ports(2)), "--engine", "sim")
    assert_one_line_error(again, f"deployment '{name}' is already running")

    # a killed engine (whole process group, like a crash) is restarted
    victim = state["replicas"][1]
    os.killpg(victim["pid"], signal.SIGKILL)

    def restarted() -> dict | None:  # type: ignore[type-arg]
        now = read_state(home, name)
        replica = now["replicas"][1] if now else None
        return now if replica and replica["restarts"] == 1 and replica["state"] == "ready" else None

    state = wait_for(restarted, 360, "replica 1 to be restarted", proc)
    assert state["replicas"][1]["pid"] != victim["pid"]
    assert state["replicas"][1]["last_exit_code"] == -signal.SIGKILL
    assert ask(state["replicas"][1]["url"], "embedded", with_image=True)["prompt_tokens"] > 20
    events = (home / "deployments" / name / "supervisor.log").read_text()
    assert f"replica 1 (pid {victim['pid']}) exited with code -9; restarting" in events

    # Ctrl-C stops every process the supervisor started: nothing is left behind
    tree = [child.pid for child in psutil.Process(proc.pid).children(recursive=True)]
    assert len(tree) >= 4  # two API servers, each with its engine core (and workers), and the gateway
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, output
    assert "all processes stopped" in output
    leftovers = [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert leftovers == [], f"left behind: {leftovers}"
    assert all(port_is_free("127.0.0.1", port) for port in (base, base + 1, base + 2))
    final = read_state(home, name)
    assert final is not None and {r["state"] for r in final["replicas"]} == {"stopped"}


# ---- the simulated engine behind the gateway (fast) -----------------------------------


def sim_available() -> bool:
    return "engine" in registered_verbs()


@pytest.mark.skipif(not sim_available(), reason="`vlmserve engine sim` is not registered yet")
def test_sim_replicas_behind_gateway_stop_on_sigterm(
    vlmserve_cmd: list[str], home: Path, up_process: list[subprocess.Popen[str]]
) -> None:
    base = free_ports(3)
    name = "simgw"
    proc = spawn_up(vlmserve_cmd, home, up_process, "--name", name, "--engine", "sim", "--model", "sim-model",
                    "--replicas", "2", "--port", str(base))  # fmt: skip

    def gateway_ready() -> dict | None:  # type: ignore[type-arg]
        state = all_ready(home, name, 2)
        if state and (state["gateway"] is None or state["gateway"]["state"] == "ready"):
            return state
        return None

    state = wait_for(gateway_ready, 120, "sim replicas and gateway ready", proc)
    endpoint = state["endpoint"]
    if "gateway" in registered_verbs():
        assert state["gateway"] is not None and endpoint == f"http://127.0.0.1:{base}"
    assert ask(endpoint, "sim-model", with_image=False)["completion_tokens"] >= 1
    tree = [child.pid for child in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    leftovers = [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert leftovers == [], f"left behind: {leftovers}"


def tree_of(proc: subprocess.Popen[str]) -> list[int]:
    return [child.pid for child in psutil.Process(proc.pid).children(recursive=True)]


def living(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.skipif(not sim_available(), reason="`vlmserve engine sim` is not registered yet")
def test_down_stops_a_deployment_and_cleans_up_after_a_killed_supervisor(
    vlmserve_cmd: list[str], home: Path, up_process: list[subprocess.Popen[str]]
) -> None:
    def down(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*vlmserve_cmd, "down", name], capture_output=True, text=True, timeout=120, env=cli_env(home))

    # a running supervisor is asked to stop, and stops everything
    proc = spawn_up(vlmserve_cmd, home, up_process, "--name", "d1", "--engine", "sim", "--model", "m", "--no-gateway",
                    "--port", str(free_ports(2)))  # fmt: skip
    wait_for(lambda: all_ready(home, "d1", 1), 120, "sim replica ready", proc)
    tree = tree_of(proc)
    done = down("d1")
    assert done.returncode == 0 and "'d1' stopped" in done.stdout, done.stderr
    assert proc.wait(timeout=30) == 0
    assert living(tree) == []

    # a supervisor killed outright leaves its engines behind; `down` finds and stops them
    proc = spawn_up(vlmserve_cmd, home, up_process, "--name", "d2", "--engine", "sim", "--model", "m", "--no-gateway",
                    "--port", str(free_ports(2)))  # fmt: skip
    wait_for(lambda: all_ready(home, "d2", 1), 120, "sim replica ready", proc)
    tree = tree_of(proc)
    proc.kill()
    proc.wait(timeout=30)
    assert living(tree), "the orphaned engine should still be running before `down`"
    status = subprocess.run([*vlmserve_cmd, "status", "d2"], capture_output=True, text=True, timeout=60, env=cli_env(home))
    assert "orphaned: run `vlmserve down d2`" in status.stdout, status.stdout
    done = down("d2")
    assert done.returncode == 0 and "1 leftover process group(s) cleaned up" in done.stdout, done.stdout + done.stderr
    assert living(tree) == []
    done = down("nope")
    assert_one_line_error(done, "no deployment named 'nope'")


@pytest.mark.skipif(not sim_available(), reason="`vlmserve engine sim` is not registered yet")
def test_stale_engine_on_the_port_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the port check cannot close: a leftover engine grabs the port after the check.

    The leftover serves another model; the supervisor must refuse it (its own engine cannot
    bind, or the stranger is caught by the model/owner check), never report it ready.
    """
    from tests.helpers.sim import start_sim_engine
    from vlmserve.deploy import processes
    from vlmserve.deploy.supervisor import Supervisor
    from vlmserve.errors import UserError
    from vlmserve.spec import DeploymentSpec

    with start_sim_engine(model="yesterdays-model") as stale:
        monkeypatch.setattr(processes, "port_is_free", lambda host, port: True)  # the check ran before it came up
        spec = DeploymentSpec(name="stale", engine="sim", model="todays-model", gateway=False,
                              port=stale.port - 1, ready_timeout_s=60)  # fmt: skip
        with pytest.raises(UserError) as caught:
            Supervisor(spec, state_dir=tmp_path).start()
        message = caught.value.message
        assert ("serves another configuration" in message and "yesterdays-model" in message) or (
            "exited with code" in message and "ddress already in use" in message
        ), message
        assert httpx.get(f"{stale.base_url}/health", timeout=10).status_code == 200  # the stranger is left alone
