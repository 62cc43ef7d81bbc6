"""`vlmserve recipe show`: the vLLM command line a model's recipe and your flags make, flag by flag."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any, Optional

import typer
from rich.table import Table

from vlmserve.cli import consoles
from vlmserve.errors import UserError

console = consoles.console(highlight=False)

recipe_app = typer.Typer(help="Model recipes: the vLLM flags each VLM family needs (docs/recipes.md).", no_args_is_help=True)

_KEY = re.compile(r"[a-z][a-z0-9_]*")
FLAG_HELP = "write it like reasoning_parser=qwen3, enable_auto_tool_choice or limit_mm_per_prompt='{\"image\":2}'"


def parse_flag(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` (VALUE read as JSON when it is JSON, else as text), `KEY` (a switch on) or
    `no-KEY` (a switch off); KEY as in engine_args or as vLLM spells it (`--reasoning-parser`)."""
    raw_key, has_value, raw_value = text.partition("=")
    key = raw_key.strip().removeprefix("--").replace("-", "_")
    if not _KEY.fullmatch(key):
        raise UserError(f"--flag {text!r}: {raw_key.strip() or 'the name'!s} is not a flag name; {FLAG_HELP}")
    if not has_value:
        return (key[3:], False) if key.startswith("no_") else (key, True)
    if not raw_value.strip():
        raise UserError(f"--flag {text!r}: no value after '='; {FLAG_HELP}")
    try:
        return key, json.loads(raw_value)
    except json.JSONDecodeError:
        if raw_value.lstrip().startswith(("{", "[")):
            raise UserError(f"--flag {text!r}: the value is not valid JSON; {FLAG_HELP}") from None
        return key, raw_value


def user_engine_args(flags: list[str]):  # -> EngineArgs
    """The --flag values as engine_args, checked as a spec's are (a misspelling is refused)."""
    from pydantic import ValidationError

    from vlmserve.spec import EngineArgs, describe_validation_error

    values: dict[str, Any] = {}
    for text in flags:
        key, value = parse_flag(text)
        if key in values:
            raise UserError(f"--flag: '{key}' is given twice; keep one")
        values[key] = value
    try:
        return EngineArgs.model_validate(values)
    except ValidationError as err:
        raise UserError(describe_validation_error(err, "--flag").replace("field '(top level).", "field '")) from None


@recipe_app.command("show")
def show(
    model: str = typer.Argument(..., help="Model directory (config.json is enough), cached hub id, or 'embedded'."),
    benchmark: bool = typer.Option(False, "--benchmark", help="Add the benchmark changes (prefix caching off)."),
    flag: Optional[list[str]] = typer.Option(
        None, "--flag", help="Your own vLLM flag, KEY=VALUE (repeatable); it replaces the recipe's."
    ),
) -> None:
    """Print the vLLM flags the model's recipe and your --flag values make, each marked recipe or user."""
    from vlmserve.recipes.apply import choose_recipe, resolve_for

    args = user_engine_args(flag or [])
    chosen = choose_recipe(model)
    resolution = resolve_for(chosen, args, benchmark=benchmark)
    for warning in resolution.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if chosen.recipe is None:
        console.print(f"{chosen.basis}; only your flags are shown", soft_wrap=True)
    else:
        console.print(f"recipe: {chosen.basis}", soft_wrap=True)
    table = Table(title_justify="left")
    table.add_column("flag", no_wrap=True)  # whole flag names: a test or a reader greps for them
    table.add_column("value", overflow="fold")
    table.add_column("from", no_wrap=True)
    table.add_column("why", overflow="fold")
    for each in resolution.flags:
        value = " ".join(each.argv[1:]) if len(each.argv) > 1 else ""
        table.add_row(each.argv[0] if each.argv else each.key, value, each.origin, each.why)
    if resolution.flags:
        console.print(table)
    else:
        console.print("no flags: vLLM's defaults apply")
    console.print(
        "command line (`vlmserve up` adds --host, --port, --served-model-name, --allowed-media-domains):", soft_wrap=True
    )
    console.print(shlex.join(["vllm", "serve", model, *resolution.argv()]), soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.add_typer(recipe_app, name="recipe")
