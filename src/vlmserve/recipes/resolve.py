"""Lay a recipe's flags under the user's own and check them against the installed vLLM.

The rules: a flag the user gives (an engine_args field or key, or a flag in extra_args) replaces the
recipe's flag of that name whatever its value; a recipe flag the installed vLLM lacks (the flag, or
the parser it names) is dropped with a one-line warning, since a recipe written for a newer vLLM
must not stop an older one from starting; where vLLM is not installed nothing is checked (the
engine that reads the flags checks them). The user's own flags are checked elsewhere, strictly
(`vllm_flags.check_engine_arg` refuses a misspelling), and never dropped here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.recipes.families import BENCHMARK_FLAGS, FlagTable, ModelFacts, Recipe
from vlmserve.spec import EngineArgs
from vlmserve.vllm_flags import PARSER_SOURCE_DIRS, engine_arg_argv, vllm_has_flag, vllm_has_parser, vllm_version

FlagCheck = Callable[[str, JSONValue], "str | None"]
"""(flag key, value) -> why the installed vLLM cannot take it; None when it can (or cannot be told)."""

REQUIRES: dict[str, str] = {"enable_auto_tool_choice": "tool_call_parser"}
"""A recipe flag that vLLM refuses without another one (auto tool choice needs a tool parser)."""

Origin = Literal["recipe", "user"]


@dataclass(frozen=True)
class ResolvedFlag:
    """One flag of the resulting command line, and where it came from."""

    key: str
    value: JSONValue
    origin: Origin
    why: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Resolution:
    """The recipe laid under the user's flags: what `up` passes, what `recipe show` prints."""

    family: str | None
    flags: tuple[ResolvedFlag, ...]
    warnings: tuple[str, ...]
    engine_args: EngineArgs
    """The user's engine_args with the recipe's kept flags filled in (fields set, other flags
    appended to extra_args, already rendered: no vLLM import is needed to start)."""

    def argv(self) -> list[str]:
        return [item for flag in self.flags for item in flag.argv]

    def recipe_flags(self) -> list[ResolvedFlag]:
        return [flag for flag in self.flags if flag.origin == "recipe"]


def option(key: str) -> str:
    return "--" + key.replace("_", "-")


def render(key: str, value: JSONValue) -> tuple[str, ...]:
    """A flag as vLLM reads it, without asking vLLM: bools as switches, mappings as compact JSON."""
    if isinstance(value, bool):
        return (option(key),) if value else ("--no-" + option(key)[2:],)
    if value is None:
        return ()
    if isinstance(value, dict):
        return (option(key), json.dumps(value, separators=(",", ":")))
    if isinstance(value, (list, tuple)):
        return (option(key), *(str(item) for item in value))
    return (option(key), str(value))


def installed_vllm_check(key: str, value: JSONValue) -> str | None:
    """The real check: the flag's name, and for parser flags the parser's name, in the installed vLLM."""
    version = vllm_version()
    installed = f"the installed vLLM {version}" if version else "the installed vLLM"
    if vllm_has_flag(key) is False:
        return f"{installed} has no such flag"
    if key in PARSER_SOURCE_DIRS and isinstance(value, str) and vllm_has_parser(key, value) is False:
        kind = key.removesuffix("_parser").replace("_", " ")
        return f"{installed} has no {kind} parser named '{value}'"
    return None


def recipe_flag_table(
    recipe: Recipe | None, facts: ModelFacts, *, benchmark: bool, chat_template: str | None = None
) -> FlagTable:
    """The recipe's flags for this model, with the benchmark changes laid on top when asked."""
    table: FlagTable = dict(recipe.flags(facts)) if recipe is not None else {}
    if chat_template is not None:
        table["chat_template"] = (
            chat_template,
            f"{recipe.family if recipe else 'recipe'}: tool chat template found in the model directory",
        )
    if benchmark:
        table.update(BENCHMARK_FLAGS)
    return table


def _extra_arg_groups(extra_args: list[str]) -> list[tuple[str, list[str]]]:
    """`["--seed", "7", "--enforce-eager"]` -> [("seed", [...]), ("enforce_eager", [...])]; a
    `--no-x` switch names `x`, `--x=v` and `--x.sub v` name `x`."""
    groups: list[tuple[str, list[str]]] = []
    for item in extra_args:
        if item.startswith("--") and len(item) > 2:
            name = item[2:].split("=", 1)[0].split(".", 1)[0].replace("-", "_")
            groups.append((name.removeprefix("no_"), [item]))
            if name.startswith("no_"):
                groups.append((name, []))  # `--no-x` might also be a flag of its own name
        elif groups:
            groups[-1][1].append(item)
        else:
            groups.append(("", [item]))
    return groups


def user_flags(args: EngineArgs) -> list[ResolvedFlag]:
    """The user's own flags: engine_args fields that were set, other keys, then extra_args."""
    flags: list[ResolvedFlag] = []
    for name in EngineArgs.model_fields:
        if name == "extra_args":
            continue
        value = getattr(args, name)
        if value is None or name not in args.model_fields_set:
            continue
        flags.append(ResolvedFlag(name, value, "user", "engine_args", render(name, value)))
    for key, value in args.vllm_flags().items():
        flags.append(ResolvedFlag(key, value, "user", "engine_args", tuple(engine_arg_argv(key, value))))
    for name, items in _extra_arg_groups(list(args.extra_args)):
        if items:
            flags.append(ResolvedFlag(name, " ".join(items[1:]) or True, "user", "extra_args", tuple(items)))
    return flags


def user_flag_keys(args: EngineArgs) -> set[str]:
    """Every flag name the user gives, however given (the recipe steps aside for each); nothing is
    rendered, so vLLM's parser is not needed to tell."""
    keys = {
        name
        for name in EngineArgs.model_fields
        if name != "extra_args" and name in args.model_fields_set and getattr(args, name) is not None
    }
    keys |= set(args.vllm_flags())
    keys |= {name for name, _ in _extra_arg_groups(list(args.extra_args))}
    return keys


def resolve(args: EngineArgs, table: FlagTable, *, family: str | None, check: FlagCheck = installed_vllm_check) -> Resolution:
    """The recipe's `table` under the user's `args`: user flags win; flags vLLM lacks are dropped."""
    given = user_flag_keys(args)
    warnings: list[str] = []
    kept: dict[str, tuple[JSONValue, str]] = {}
    for key, (value, why) in table.items():
        if key in given:
            continue
        problem = check(key, value)
        if problem is not None:
            warnings.append(f"recipe flag {' '.join(render(key, value))} dropped: {problem}")
            continue
        kept[key] = (value, why)
    for key, needed in REQUIRES.items():
        if key in kept and needed not in kept and needed not in given:
            del kept[key]
            warnings.append(f"recipe flag {option(key)} dropped: vLLM refuses it without {option(needed)}")
    recipe_flags = [ResolvedFlag(key, value, "recipe", why, render(key, value)) for key, (value, why) in kept.items()]
    replaced = {key for key in table if key in given}
    users = [
        flag
        if flag.key not in replaced
        else ResolvedFlag(
            flag.key,
            flag.value,
            "user",
            f"{flag.why}; replaces the recipe's {' '.join(render(flag.key, table[flag.key][0]))}",
            flag.argv,
        )
        for flag in user_flags(args)
    ]
    return Resolution(family, tuple(recipe_flags + users), tuple(warnings), laid_under(args, kept))


def laid_under(args: EngineArgs, kept: dict[str, tuple[JSONValue, str]]) -> EngineArgs:
    """`args` with the recipe's kept flags filled in: fields by value, other flags rendered onto
    extra_args (so starting needs no vLLM import to render them; user keys were removed already)."""
    fields: JSONObject = {}
    extra: list[str] = []
    for key, (value, _) in kept.items():
        if key in EngineArgs.model_fields:
            fields[key] = value
        else:
            extra.extend(render(key, value))
    if not fields and not extra:
        return args
    return args.model_copy(update={**fields, "extra_args": [*extra, *args.extra_args]})  # the user's stay last
