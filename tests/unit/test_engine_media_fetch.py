"""Replicas fetch media only from the spec's allowlist and never through a redirect, as the installed vLLM reads it.

The command line is parsed by vLLM's own `vllm serve` parser and the environment variable is looked
up in vLLM's own list of the variables it reads (importing vLLM's parser: a few seconds, once).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from vlmserve.engines.vllm import MEDIA_REDIRECTS_ENV, NO_REMOTE_MEDIA_DOMAIN, engine_arguments, plan_launches
from vlmserve.spec import DeploymentSpec
from vlmserve.vllm_flags import installed_vllm_flags

pytestmark = pytest.mark.skipif(installed_vllm_flags() is None, reason="vLLM is not installed")


def _spec(**fields: object) -> DeploymentSpec:
    return DeploymentSpec.model_validate({"name": "t", "model": "embedded", "replicas": 2, **fields})


def _vllm_parse(argv: list[str]) -> object:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser()).parse_args(argv)


def _vllm_env_names() -> str:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    return (Path(list(spec.submodule_search_locations)[0]) / "envs.py").read_text(encoding="utf-8")


@pytest.mark.hostile("SSRF at the engine: an allowlisted media host that redirects to an internal address")
def test_replicas_carry_the_allowlist_and_never_follow_media_redirects(tmp_path: Path) -> None:
    spec = _spec(allowed_media_domains=["images.example.com", "cdn.example.org"])
    parsed = _vllm_parse(engine_arguments(spec, str(tmp_path), 8001, "cpu"))
    assert parsed.allowed_media_domains == ["images.example.com", "cdn.example.org"]  # type: ignore[attr-defined]
    launches = plan_launches(spec, str(tmp_path), "cpu")
    assert len(launches) == 2
    for launch in launches:
        assert launch.env["VLLM_MEDIA_URL_ALLOW_REDIRECTS"] == "0"
    for name in MEDIA_REDIRECTS_ENV:
        assert f'"{name}"' in _vllm_env_names(), name  # a variable the installed vLLM reads


def test_without_an_allowlist_replicas_fetch_from_no_host(tmp_path: Path) -> None:
    spec = _spec()
    parsed = _vllm_parse(engine_arguments(spec, str(tmp_path), 8001, "cpu"))
    assert parsed.allowed_media_domains == [NO_REMOTE_MEDIA_DOMAIN]  # type: ignore[attr-defined]
    assert all(launch.env["VLLM_MEDIA_URL_ALLOW_REDIRECTS"] == "0" for launch in plan_launches(spec, str(tmp_path), "cpu"))


def test_the_operator_may_turn_redirects_back_on_in_the_spec(tmp_path: Path) -> None:
    spec = _spec(env={"VLLM_MEDIA_URL_ALLOW_REDIRECTS": "1"})
    assert all(launch.env["VLLM_MEDIA_URL_ALLOW_REDIRECTS"] == "1" for launch in plan_launches(spec, str(tmp_path), "cpu"))


def test_the_specs_internal_media_opt_in_reaches_the_gateway_command() -> None:
    from typer.testing import CliRunner

    from vlmserve.cli.app import build_app
    from vlmserve.deploy.front_door import gateway_argv

    assert "--allow-internal-media-addresses" not in gateway_argv(_spec(), ["http://127.0.0.1:8001"])
    argv = gateway_argv(
        _spec(allowed_media_domains=["images.internal"], allow_internal_media_addresses=True), ["http://127.0.0.1:8001"]
    )
    assert "--allow-internal-media-addresses" in argv
    # the gateway's own parser takes the flag (no replica given: refused after parsing, before serving)
    result = CliRunner().invoke(build_app(), ["gateway", "--allow-internal-media-addresses"])
    assert result.exit_code != 0 and "no replicas given" in str(result.output) + str(result.exception)
