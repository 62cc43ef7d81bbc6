"""`vlmserve up`, `vlmserve status`, `vlmserve demo`: wiring from flags to the supervisor."""

from __future__ import annotations

import json
import shlex
import signal
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Group
from rich.table import Table
from rich.text import Text

from vlmserve.cli import consoles
from vlmserve.cli.model_options import GROUP, with_groups
from vlmserve.cli.up_options import UP
from vlmserve.errors import UserError

if TYPE_CHECKING:
    from vlmserve.deploy.state import DeploymentState

console = consoles.console(highlight=False)


def build_spec(file: Path | None, overrides: dict[str, Any], engine_overrides: dict[str, Any]):  # -> DeploymentSpec
    """The spec file (if any) with the flags that were given laid over it.

    Relative file paths in the spec file are read next to it; those given as flags, from the
    current directory (made absolute here, so the gateway sees the same file wherever it runs)."""
    from vlmserve.spec import SPEC_FILE_PATHS, DeploymentSpec, describe_validation_error, load_yaml_file, resolve_spec_paths

    data: dict[str, Any] = {}
    source = "flags"
    if file is not None:
        loaded = load_yaml_file(file)
        if not isinstance(loaded, dict):
            raise UserError(f"{file}: a deployment spec is a YAML mapping (model:, replicas:, ...)")
        data = resolve_spec_paths(loaded, file)
        source = str(file)
    for key in SPEC_FILE_PATHS:
        if isinstance(overrides.get(key), (str, Path)):
            overrides[key] = str(Path(overrides[key]).expanduser().resolve())
    data.update({key: value for key, value in overrides.items() if value is not None})
    engine_args = dict(data.get("engine_args") or {})
    extra = engine_overrides.pop("extra_args", None)
    engine_args.update({key: value for key, value in engine_overrides.items() if value is not None})
    if extra:
        engine_args["extra_args"] = list(engine_args.get("extra_args") or []) + extra
    if engine_args:
        data["engine_args"] = engine_args
    try:
        return DeploymentSpec.model_validate(data)
    except ValidationError as err:
        raise UserError(describe_validation_error(err, source)) from None


def with_autoscale_bounds(spec, text: str):  # (DeploymentSpec, str) -> DeploymentSpec
    """The spec with `--autoscale MIN:MAX` laid over its autoscale: section (or the rule's defaults)."""
    from vlmserve.autoscale import AutoscaleRule, parse_min_max

    try:
        low, high = parse_min_max(text)
        rule = AutoscaleRule.model_validate(
            {**(spec.autoscale.model_dump() if spec.autoscale else {}), "min_replicas": low, "max_replicas": high}
        )
    except ValueError as err:  # pydantic's ValidationError is a ValueError
        detail = err.errors()[0]["msg"] if isinstance(err, ValidationError) else str(err)
        raise UserError(f"--autoscale {text}: {detail}") from None
    return spec.model_copy(update={"autoscale": rule})


def split_engine_args(values: list[str] | None) -> list[str]:
    """`--engine-arg "--swap-space 1" --engine-arg=--enforce-eager` -> a flat argv list."""
    flat: list[str] = []
    for value in values or []:
        flat.extend(shlex.split(value))
    return flat


@with_groups(UP)
def up(flags: dict[str, Any] = GROUP) -> None:
    """Start and supervise engine replicas (and the gateway) until Ctrl-C or SIGTERM."""
    from vlmserve.spec import DeploymentSpec, EngineArgs

    if flags["benchmark_recipe"] and flags["recipe"] is False:
        raise UserError("--benchmark-recipe and --no-recipe contradict each other; give one")
    overrides = UP.fields(flags, DeploymentSpec)
    if flags["benchmark_recipe"]:
        overrides["recipe"] = "benchmark"
    engine_overrides = {**UP.fields(flags, EngineArgs), "extra_args": split_engine_args(flags["engine_arg"])}
    spec = build_spec(flags["file"], overrides, engine_overrides)
    if flags["autoscale"] is not None:
        spec = with_autoscale_bounds(spec, flags["autoscale"])
    if flags["print_plan"]:
        _print_plan(spec)
        return
    run_until_signalled(spec)


def run_until_signalled(spec) -> None:  # spec: DeploymentSpec
    """Start the deployment, print where it is, and keep it up until Ctrl-C or SIGTERM."""
    from vlmserve.deploy.supervisor import Supervisor

    def _terminate(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous_term = signal.signal(signal.SIGTERM, _terminate)
    previous_hup = signal.signal(signal.SIGHUP, _terminate)  # a closed terminal stops it cleanly too
    supervisor = Supervisor(spec, on_event=console.print)
    try:
        supervisor.start()
        console.print(status_table([supervisor.status()]))
        console.print(
            f"[bold green]serving[/bold green] {supervisor.served_model_name} at {supervisor.endpoint} "
            f"({door_description(spec, open_door=supervisor.is_open)}) — Ctrl-C stops everything"
        )
        while not supervisor.stopping:
            supervisor.wait(1.0)
    except KeyboardInterrupt:
        console.print("stopping every process (Ctrl-C / SIGTERM / SIGHUP)")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            supervisor.stop()
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, previous_term)
            signal.signal(signal.SIGHUP, previous_hup)
    console.print("all processes stopped")


def door_description(spec, *, open_door: bool) -> str:  # spec: DeploymentSpec
    """How clients get in, for the start-up line: who may use it, and whether it is open."""
    if open_door:
        reach = "this machine only" if spec.loopback_only else "anyone who can reach it"
        return f"[bold yellow]open[/bold yellow]: no API keys, {reach}"
    return f"API keys required ({spec.keys_file})"


def _print_plan(spec) -> None:  # spec: DeploymentSpec
    """Each replica's environment and command, then the gateway's: what `up` would start."""
    from vlmserve.deploy.front_door import gateway_argv, shown_gateway_env
    from vlmserve.engines.launcher import make_launcher

    rule = spec.autoscale
    planned = spec if rule is None else spec.model_copy(update={"replicas": rule.max_replicas})
    starting = spec.replicas if rule is None else max(rule.min_replicas, min(rule.max_replicas, spec.replicas))
    launches = make_launcher(planned, on_event=lambda line: console.print(line, soft_wrap=True)).launches()
    for index, launch in enumerate(launches):
        standby = " (standby: started when the autoscale rule asks)" if index >= starting else ""
        console.print(f"[bold]replica {index}[/bold] port {launch.port}{standby}")
        env_text = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(launch.env.items()))
        console.print(f"  {env_text} {shlex.join(launch.argv)}", soft_wrap=True)
    if spec.gateway:
        urls = [f"http://{spec.replica_host}:{launch.port}" for launch in launches]
        argv = gateway_argv(spec, urls)
        if rule is not None:  # the supervisor's members file, as Supervisor._preflight passes it
            from vlmserve.deploy.members_file import DISCOVER_INTERVAL_S, MEMBERS_FILE
            from vlmserve.paths import deployment_dir

            members = f"file:{deployment_dir(spec.name) / MEMBERS_FILE}"
            argv = gateway_argv(spec.model_copy(update={"gateway_discover": members}), []) + [
                "--discover-interval",
                f"{DISCOVER_INTERVAL_S:g}",
            ]
        console.print(f"[bold]gateway[/bold] port {spec.port}")
        env_text = "".join(f"{key}={shlex.quote(value)} " for key, value in shown_gateway_env(spec).items())
        console.print(f"  {env_text}{shlex.join(argv)}", soft_wrap=True)


def status(
    name: Optional[str] = typer.Argument(None, help="Deployment name (default: every deployment)."),
    as_json: bool = typer.Option(False, "--json", help="Print the raw state as JSON."),
) -> None:
    """List each deployment's replicas: port, pid, state, restarts, uptime."""
    from vlmserve.deploy.state import list_deployments, read_state, state_path
    from vlmserve.deploy.state_saver import state_alarm
    from vlmserve.paths import home_dir

    names = [name] if name else list_deployments()
    states = []
    for each in names:
        path = state_path(each)
        state = read_state(path)
        if state is None:
            raise UserError(f"no deployment named '{each}' under {home_dir()}; start one with `vlmserve up`")
        if not state.supervisor_alive():
            states.append(state.reconciled())
            continue
        alarm = state_alarm(state, path)  # a full disk: the file is what was last saved, not what runs
        states.append(state.with_alarm(alarm) if alarm else state)
    if as_json:
        typer.echo(json.dumps([state.model_dump(mode="json") for state in states], indent=2))
        return
    if not states:
        console.print(f"no deployments under {home_dir()}; start one with `vlmserve up`")
        return
    console.print(status_table(states))


def describe_cold_start(phases: dict[str, float] | None) -> str:
    """'49 s (weights 43, engine 2, listening 2)': the last start, then its phases from the engine's log."""
    if not phases or "start_to_ready_s" not in phases:
        return ""
    parts = [
        f"{name} {phases[key]:.0f}"
        for name, key in (
            ("weights", "start_to_weights_s"),
            ("engine", "weights_to_engine_s"),
            ("listening", "engine_to_listening_s"),
        )
        if key in phases
    ]
    return f"{phases['start_to_ready_s']:.0f} s" + (f" ({', '.join(parts)})" if parts else "")


def status_table(states: "list[DeploymentState]") -> Group:
    """One table per deployment: each process's port, pid, state, restarts and uptime."""
    from vlmserve.deploy.state import format_uptime

    now = time.time()
    tables: list[Table | Text] = []
    for state in states:
        if state.is_stopped():
            where = f"stopped (last served at {state.endpoint})" if state.endpoint else "stopped"
        else:
            where = f"at {state.endpoint or '-'}"
        table = Table(
            title=f"deployment [bold]{state.name}[/bold]: {state.served_model_name or state.model} {where}", title_justify="left"
        )
        for column in ("process", "port", "pid", "state", "restarts", "uptime", "devices", "cold start", "last restart"):
            table.add_column(column, justify="right" if column in ("port", "pid", "restarts") else "left")
        for member in state.members:
            colour = {"ready": "green", "restarting": "yellow", "failed": "red"}.get(member.state, "white")
            table.add_row(
                member.label,
                str(member.port),
                str(member.pid or "-"),
                f"[{colour}]{member.state}[/{colour}]",
                str(member.restarts),
                format_uptime(member.started_at, now),
                member.devices or "",
                describe_cold_start(member.cold_start),
                member.last_restart_reason or "",
            )
        if state.autoscale:
            last = state.autoscale.get("last_decision") or {}
            rule = state.autoscale.get("rule") or {}
            tables.append(
                Text(
                    f"autoscale {rule.get('min_replicas')}..{rule.get('max_replicas')} on "
                    f"{state.autoscale.get('metric')}: {last.get('waiting', 0):g} waiting, "
                    f"wants {last.get('wants', '-')}, {last.get('reason', 'no reading yet')}"
                )
            )
        if state.alarm:  # above the table: the rows below are what was last saved, not what runs
            tables.append(Text(f"deployment {state.name}: {state.alarm}", style="bold red"))
        tables.append(table)
    return Group(*tables)


def down(
    name: str = typer.Argument("default", help="Deployment name."),
    timeout_s: float = typer.Option(90.0, help="How long to wait for the supervisor to stop everything."),
) -> None:
    """Stop a deployment from another terminal (also cleans up after a supervisor that was killed)."""
    from vlmserve.deploy.down import stop_deployment

    stop_deployment(name, timeout_s, console.print)


def demo(
    model: str = typer.Option("embedded", help="Model to demo (default: the embedded tiny VLM)."),
    max_tokens: int = typer.Option(32, help="Tokens to generate per answer."),
    report: bool = typer.Option(
        True, "--report/--no-report", help="Two replicas behind the gateway, a short sweep and an HTML report (default)."
    ),
) -> None:
    """Make the embedded VLM, start it, send a text and an image request, sweep briefly, write the report, stop."""
    from vlmserve.demo.run import run_demo

    run_demo(console, model=model, max_tokens=max_tokens, report=report)


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("status")(status)
    app.command("down")(down)
    app.command("demo")(demo)
