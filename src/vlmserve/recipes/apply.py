"""Pick a model's recipe and lay it under a deployment's engine_args (what `vlmserve up` runs).

Choosing reads config.json only (no weights, no vLLM import): start-up does not grow. A spec with
`recipe: false` is left as it is; `recipe: benchmark` adds the benchmark changes (prefix caching off).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vlmserve.errors import UserError
from vlmserve.recipes.families import EMBEDDED_RECIPE, ModelFacts, Recipe, find_recipe, known_families
from vlmserve.recipes.model_config import find_model_config
from vlmserve.recipes.resolve import FlagCheck, Resolution, installed_vllm_check, recipe_flag_table, resolve
from vlmserve.spec import EMBEDDED_MODEL, DeploymentSpec, EngineArgs


@dataclass(frozen=True)
class ChosenRecipe:
    """The recipe for a model (None: no family matched) and what the choice was based on."""

    recipe: Recipe | None
    facts: ModelFacts
    basis: str  # one line: which config, which model_type, or why there is none
    model_dir: Path | None


def choose_recipe(model: str, model_path: str | None = None) -> ChosenRecipe:
    """The recipe for `model` (its resolved `model_path` when known); bad local paths raise UserError."""
    if model == EMBEDDED_MODEL:
        return ChosenRecipe(EMBEDDED_RECIPE, ModelFacts({}, model), "vlmserve's embedded model", None)
    where = model_path or model
    found = find_model_config(where)
    if found.config is None:
        return ChosenRecipe(None, ModelFacts({}, where), f"unknown family: {found.where}", None)
    recipe = find_recipe(found.config)
    model_type = found.config.get("model_type", "(none)")
    if recipe is None:
        basis = f"unknown family: model_type {model_type!r} in {found.where} has no recipe (known: {', '.join(known_families())})"
    else:
        basis = f"{recipe.family} (model_type {model_type!r} in {found.where})"
    local = Path(found.where)
    return ChosenRecipe(recipe, ModelFacts(found.config, where), basis, local.parent if local.is_file() else None)


def tool_chat_template(chosen: ChosenRecipe, engine_model_dir: str | None = None) -> str | None:
    """The family's tool chat template when the model directory holds it (vLLM's wheel ships none),
    as the engine sees it: under `engine_model_dir` when the engine mounts the directory elsewhere
    (a Kubernetes pod), else where it lies here."""
    if chosen.recipe is None or chosen.recipe.tool_chat_template is None or chosen.model_dir is None:
        return None
    name = chosen.recipe.tool_chat_template
    if not (chosen.model_dir / name).is_file():
        return None
    return str(Path(engine_model_dir or chosen.model_dir) / name)


def resolve_for(
    chosen: ChosenRecipe,
    args: EngineArgs,
    *,
    benchmark: bool,
    check: FlagCheck = installed_vllm_check,
    engine_model_dir: str | None = None,
) -> Resolution:
    """The chosen recipe under `args`."""
    table = recipe_flag_table(
        chosen.recipe, chosen.facts, benchmark=benchmark, chat_template=tool_chat_template(chosen, engine_model_dir)
    )
    return resolve(args, table, family=chosen.recipe.family if chosen.recipe else None, check=check)


def spec_with_recipe(
    spec: DeploymentSpec, model_path: str, on_event: Callable[[str], None] | None = None, *, elsewhere: bool = False
) -> DeploymentSpec:
    """`spec` with its model's recipe laid under its engine_args (unchanged with `recipe: false`).

    elsewhere: the engine runs on another machine (a Kubernetes export) and `model_path` is its view
    of the model; the recipe is chosen from `spec.model` as this machine sees it, and a model this
    machine cannot read gets no recipe rather than an error (the export never needed the weights)."""
    if spec.recipe is False:
        return spec
    try:
        chosen = choose_recipe(spec.model, None if elsewhere else model_path)
    except UserError as err:
        if not elsewhere:
            raise
        chosen = ChosenRecipe(None, ModelFacts({}, spec.model), f"unknown family: {err.message}", None)
    resolution = resolve_for(
        chosen, spec.engine_args, benchmark=spec.recipe == "benchmark", engine_model_dir=model_path if elsewhere else None
    )
    if on_event is not None:
        for warning in resolution.warnings:
            on_event(f"warning: {warning}")
        applied = " ".join(item for flag in resolution.recipe_flags() for item in flag.argv)
        if chosen.recipe is None:
            on_event(f"recipe: none ({chosen.basis}); vLLM's defaults apply")
        elif chosen.recipe is not EMBEDDED_RECIPE:
            on_event(
                f"recipe {chosen.recipe.family}: {applied or '(nothing beyond your flags)'} "
                "(`vlmserve recipe show` explains each; --no-recipe turns it off)"
            )
    return spec.model_copy(update={"engine_args": resolution.engine_args})
