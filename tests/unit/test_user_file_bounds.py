"""config.json, deployment specs and keys files over their bounds: one `error:` line naming the file
and the limit, exit 2 (they used to end in RecursionError, or build an alias bomb)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlmserve.bounded_read import CONFIG_FILE


def alias_bomb(top_key: str) -> str:
    """Nine levels of ten aliases: a 1 kB file that expands to a billion values."""
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"{chr(98 + level)}: &{chr(98 + level)} [{', '.join([f'*{chr(97 + level)}'] * 10)}]" for level in range(8)]
    return "\n".join(lines) + f"\n{top_key}: *i\n"


def deep_yaml(top_key: str, depth: int = 5000) -> str:
    return f"{top_key}: " + "[" * depth + "]" * depth + "\n"


DEEP_MESSAGE = f"nests deeper than {CONFIG_FILE.max_depth} levels (the limit for a config file)"
BOMB_MESSAGE = (
    f"has over {CONFIG_FILE.max_items:,} values with its aliases expanded, the limit for a config file; "
    "write the values out or use fewer aliases"
)


@pytest.mark.hostile("up --model DIR: a config.json of 100,000 nested brackets is one line naming the depth limit")
def test_deep_config_json(cli, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": ' + "[" * 100_000 + "]" * 100_000 + "}")
    done = cli("up", "--model", model, "--print-plan")
    assert done.code == 2 and "Traceback" not in done.err
    assert done.error_line == (
        f"error: {model / 'config.json'}: {DEEP_MESSAGE}; a config.json is a flat JSON object of a few kB, fix the file"
    )


@pytest.mark.hostile("up --model DIR: a config.json over 16 MiB is refused by its size before it is read")
def test_oversized_config_json(cli, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    with (model / "config.json").open("wb") as handle:
        handle.truncate(CONFIG_FILE.max_bytes + 1)  # sparse: the size alone refuses it
    done = cli("up", "--model", model, "--print-plan")
    assert done.code == 2
    assert done.error_line.startswith(
        f"error: {model / 'config.json'}: is {CONFIG_FILE.max_bytes + 1:,} bytes, over "
        f"the {CONFIG_FILE.max_bytes:,}-byte limit for a config file"
    )


@pytest.mark.hostile("up -f SPEC: a spec nested 5,000 deep, and a billion-laughs alias bomb: one line each")
@pytest.mark.parametrize("kind", ["deep", "bomb"])
def test_hostile_deployment_spec(cli, tmp_path: Path, kind: str) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(deep_yaml("engine_args") if kind == "deep" else alias_bomb("engine_args"))
    done = cli("up", "-f", spec, "--print-plan")
    assert done.code == 2 and "Traceback" not in done.err
    assert done.error_line == f"error: {spec}: {DEEP_MESSAGE if kind == 'deep' else BOMB_MESSAGE}"


@pytest.mark.hostile("gateway --keys-file: a keys file nested 5,000 deep, and a billion-laughs alias bomb: one line each")
@pytest.mark.parametrize("kind", ["deep", "bomb"])
def test_hostile_keys_file(cli, tmp_path: Path, kind: str) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(deep_yaml("tenants") if kind == "deep" else alias_bomb("tenants"))
    done = cli("gateway", "--keys-file", keys, "--replica", "http://127.0.0.1:9")
    assert done.code == 2 and "Traceback" not in done.err
    assert done.error_line == f"error: {keys}: {DEEP_MESSAGE if kind == 'deep' else BOMB_MESSAGE}"
