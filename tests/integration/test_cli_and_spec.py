"""The CLI's surface and the spec's validation messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vlmserve import __version__
from vlmserve.errors import UserError
from vlmserve.spec import SLO, DeploymentSpec, load_deployment_spec


def run_cli(vlmserve_cmd: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*vlmserve_cmd, *args], capture_output=True, text=True, timeout=120)


def test_version(vlmserve_cmd: list[str]) -> None:
    done = run_cli(vlmserve_cmd, "--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"vlmserve {__version__}"


def test_help_lists_verbs(vlmserve_cmd: list[str]) -> None:
    done = run_cli(vlmserve_cmd, "--help")
    assert done.returncode == 0
    assert "Usage" in done.stdout


def test_every_verb_has_help(vlmserve_cmd: list[str]) -> None:
    """Every verb's --help renders. In this process (CliRunner): the subprocess start, ~0.6 s a verb, proves
    nothing the first verb's run through `python -m vlmserve` does not."""
    import typer.main
    from typer.testing import CliRunner

    from vlmserve.cli.app import build_app

    app = build_app()
    group = typer.main.get_command(app)
    names = list(getattr(group, "commands", {}))
    assert len(names) > 10, names
    done = run_cli(vlmserve_cmd, names[0], "--help")
    assert done.returncode == 0 and "Usage" in done.stdout, (names[0], done.stderr)
    runner = CliRunner()
    for name in names:
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert "Usage" in result.output, name


def test_spec_unknown_field_is_named(tmp_path: Path) -> None:
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text("model: embedded\nreplicas: 2\nengine_args:\n  max_num_seq: 4\n")
    with pytest.raises(UserError) as caught:
        load_deployment_spec(spec_file)
    assert "engine_args.max_num_seq" in caught.value.message
    assert "not a flag of the installed vLLM; did you mean 'max_num_seqs'?" in caught.value.message


def test_spec_bad_value_is_named(tmp_path: Path) -> None:
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text("replicas: 0\n")
    with pytest.raises(UserError) as caught:
        load_deployment_spec(spec_file)
    assert "field 'replicas'" in caught.value.message


def test_spec_yaml_syntax_error(tmp_path: Path) -> None:
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text("model: [unclosed\n")
    with pytest.raises(UserError) as caught:
        load_deployment_spec(spec_file)
    assert "not valid YAML" in caught.value.message


def test_spec_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError) as caught:
        load_deployment_spec(tmp_path / "nope.yaml")
    assert "no such file" in caught.value.message


def test_replica_ports_follow_gateway() -> None:
    spec = DeploymentSpec(port=9000, replicas=3)
    assert spec.replica_ports() == [9001, 9002, 9003]


def test_slo_parse() -> None:
    slo = SLO.parse("ttft_p95=500ms,tpot_p99=50ms,e2e_p95=5s")
    assert slo.bounds_s == {"ttft_p95": 0.5, "tpot_p99": 0.05, "e2e_p95": 5.0}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("ttft_p95", "has no '='"), ("latency_p95=1s", "unknown objective"), ("ttft_p95=fast", "not a duration")],
)
def test_slo_parse_errors(text: str, fragment: str) -> None:
    with pytest.raises(UserError) as caught:
        SLO.parse(text)
    assert fragment in caught.value.message


def test_exit_code_from_a_command_reaches_the_shell() -> None:
    """typer.Exit(n) raised inside a command must become the process's exit status."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import typer\nfrom vlmserve.cli import app as cli\n"
            "@cli.app.command('exit-three')\ndef _exit_three():\n    raise typer.Exit(3)\n"
            "cli.main(['exit-three'])\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
