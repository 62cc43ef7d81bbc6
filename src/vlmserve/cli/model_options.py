"""CLI options generated from the fields of the models they set, so each default, choice and type is written once.

A flag that sets a field of a pydantic model or a dataclass (LoadSpec, GatewayConfig, SimEngineConfig ...)
is declared with `model_option(Model, "field", help=...)`: its default is read from the field, its
choices from the field's `Literal`, its flag name from the field's name (`request_timeout_s` ->
`--request-timeout`: a trailing `_s` is the unit, not the name), except where `FLAG_NAMES` says
otherwise, and a pydantic field's description is its help when none is given. vLLM-compatible
spellings (`--num-prompts` for `--num-requests`) are extra names listed once in `VLLM_ALIASES`.

Every generated option is kept in `REGISTRY`, so a test can walk every command and hold each
option against its field (`mismatches`). Options that travel together (the load flags of bench,
tune and slo-search; the gateway's settings) form an `OptionGroup`, declared once and added to a
command with `with_groups`: the command receives the group's values as one dict.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, TypeVar

import typer
from typer.models import OptionInfo

from vlmserve.errors import UserError

FLAG_NAMES: dict[str, str] = {
    # "Model.field" -> the flag, where it is not the field's name (kept for existing command lines)
    "LoadSpec.request_timeout_s": "--timeout",
    "LoadSpec.image_urls": "--image-url",
    "SimEngineConfig.cold_start_s": "--cold-start-s",
    "SimEngineConfig.allowed_image_budgets": "--image-budgets",
    "SimEngineConfig.lora_modules": "--lora-module",
    "FaultOptions.stall_s": "--stall-s",
    "GatewayConfig.replicas": "--replica",
    "DeploymentSpec.ready_timeout_s": "--ready-timeout-s",
}
"""Flags whose name is not their field's (each with `--` and dashes)."""

VLLM_ALIASES: dict[str, str] = {
    "LoadSpec.dataset": "--dataset-name",
    "LoadSpec.num_requests": "--num-prompts",
    "LoadSpec.input_len": "--random-input-len",
    "LoadSpec.output_len": "--random-output-len",
    "LoadSpec.concurrency": "--max-concurrency",
    "LoadSpec.rate": "--request-rate",
}
"""A field's flag -> the `vllm bench serve` flag accepted as its alias, so existing vLLM command lines run.

Same meanings, except: `--max-concurrency N` is vLLM's cap on requests in flight under its
`--request-rate` (default inf: all sent at once, so N in flight = N closed-loop users); here it
is N closed-loop users, and a finite `--request-rate` with it is refused (vlmserve runs either
loop, not a capped open loop). `--request-rate inf` means "no rate": use it with --max-concurrency.
`--dataset-name` takes vlmserve's workloads (random and sharegpt are vLLM's too). `--endpoint`
and `--goodput` are separate bench flags (they map onto --api and --slo)."""


@dataclass(frozen=True)
class ModelOption:
    """One generated option and the field it sets."""

    model: type
    field: str
    flag: str
    info: Any
    """The typer OptionInfo (Any, as typer.Option's own return type, so `x: int = option.info` type-checks)."""
    annotation: Any
    """The command parameter's type: the field's, unless the flag takes text (`parse`)."""
    choices: tuple[Any, ...] | None
    parse: Callable[[Any], Any] | None = None
    """Flag value -> field value, where the flag is written differently (`64x64` for (64, 64))."""
    given_only: bool = False
    """The flag's default is None, meaning "not given": the field's own default applies."""
    because: str | None = None
    """Why the flag's default differs from the field's, where it does on purpose (a verb's own default)."""

    def value(self, given: Any) -> Any:
        """The field's value for the flag's value (a value outside the choices refused in one line)."""
        if self.choices is not None:
            _choice_check(self.flag, self.choices)(given)
        return self.parse(given) if self.parse is not None and given is not None else given


@dataclass(frozen=True)
class Flag:
    """An option that sets no model field (an output path, a verb's own switch), kept in a group's order."""

    info: Any
    annotation: Any
    differs: str | None = None
    """Why a flag named as a field does not set that field as it is (said once; `mismatches` accepts it)."""

    def __post_init__(self) -> None:
        if self.differs:
            NAMED_LIKE_A_FIELD[id(self.info)] = self.differs


NAMED_LIKE_A_FIELD: dict[int, str] = {}
"""Flags named as a field on purpose but not that field's mirror, by id of their OptionInfo: why."""

REGISTRY: dict[int, ModelOption] = {}
"""Every generated option by id of its OptionInfo (the object a command's signature holds)."""


def field_names(model: type) -> tuple[str, ...]:
    """The fields of a pydantic model or a dataclass."""
    if dataclasses.is_dataclass(model):
        return tuple(item.name for item in dataclasses.fields(model))
    return tuple(model.model_fields)  # type: ignore[attr-defined]


def field_default(model: type, name: str) -> Any:
    """The field's default (its factory called); `...` when it has none."""
    if dataclasses.is_dataclass(model):
        item = next(item for item in dataclasses.fields(model) if item.name == name)
        if item.default is not dataclasses.MISSING:
            return item.default
        if item.default_factory is not dataclasses.MISSING:
            return item.default_factory()
        return ...
    info = model.model_fields[name]  # type: ignore[attr-defined]
    return ... if info.is_required() else info.get_default(call_default_factory=True)


def field_type(model: type, name: str) -> Any:
    """The field's declared type, forward references resolved."""
    if dataclasses.is_dataclass(model):
        return typing.get_type_hints(model)[name]
    return model.model_fields[name].annotation  # type: ignore[attr-defined]


def field_description(model: type, name: str) -> str | None:
    """A pydantic field's description (dataclass fields have none)."""
    if dataclasses.is_dataclass(model):
        return None
    return model.model_fields[name].description  # type: ignore[attr-defined]


def _without_none(annotation: Any) -> Any:
    """`X | None` -> X; anything else as it is."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def field_choices(model: type, name: str) -> tuple[Any, ...] | None:
    """The values a `Literal` field allows (None when it is not one)."""
    annotation = _without_none(field_type(model, name))
    return typing.get_args(annotation) if typing.get_origin(annotation) is Literal else None


def choices_text(model: type, name: str) -> str:
    """A Literal field's values for a help text, its default marked: 'poisson (default), constant or gamma'."""
    default = field_default(model, name)
    words = [f"{choice} (default)" if choice == default else str(choice) for choice in field_choices(model, name) or ()]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def cli_type(annotation: Any) -> Any:
    """The type a flag for a field of this type is parsed as: a Literal's values' type, a tuple as a list."""
    inner = _without_none(annotation)
    if typing.get_origin(inner) is Literal:
        return type(typing.get_args(inner)[0])
    if typing.get_origin(inner) in (list, tuple):
        args = [arg for arg in typing.get_args(inner) if arg is not Ellipsis]
        return types.GenericAlias(list, (cli_type(args[0]),)) if args else list
    return inner


def flag_name(model: type, name: str) -> str:
    """The flag of a field: FLAG_NAMES, else the field's name with dashes and without a unit suffix `_s`."""
    return FLAG_NAMES.get(f"{model.__name__}.{name}", "--" + name.removesuffix("_s").replace("_", "-"))


def _choice_check(flag: str, choices: tuple[Any, ...]) -> Callable[[Any], Any]:
    """A typer callback refusing a value outside `choices` in one line (None: the flag was not given)."""

    def check(value: Any) -> Any:
        if value is not None and value not in choices:
            raise UserError(f"{flag} '{value}': use one of {', '.join(str(choice) for choice in choices)}")
        return value

    return check


def model_option(
    model: type,
    name: str,
    *short: str,
    help: str | None = None,
    pair: bool = False,
    given_only: bool = False,
    default: Any = ...,
    annotation: Any = None,
    parse: Callable[[Any], Any] | None = None,
    text: Callable[[Any], Any] | None = None,
    because: str | None = None,
    vllm_alias: bool = True,
    **typer_kwargs: Any,
) -> ModelOption:
    """The option for `model.name`, registered.

    The name comes from `flag_name`; `pair` gives a bool its `--no-` form too (`--ignore-eos/--no-ignore-eos`;
    without it a bool is a switch that sets True). `given_only` makes the default None (the verb tells
    "not given" from "given"; the field's default applies). `default` is for a field that has
    none (a required field), or for a verb whose default differs on purpose, said in `because`;
    `annotation`, `parse` and `text` for a flag written as text (`text` writes the field's default
    as the flag's). `vllm_alias=False` leaves out the field's vLLM alias (a verb that is not a vLLM bench).
    Other keywords go to `typer.Option`.
    """
    model_default = field_default(model, name)
    if default is not ... and model_default is not ... and not because:
        raise ValueError(f"{model.__name__}.{name} has a default; the option takes it from there (or say why not)")
    primary = flag_name(model, name)
    alias = VLLM_ALIASES.get(f"{model.__name__}.{name}") if vllm_alias else None
    names = (f"{primary}/--no-{primary[2:]}" if pair else primary, *((alias,) if alias else ()), *short)
    if given_only:
        cli_default = None
    elif default is not ...:
        cli_default = default
    else:
        cli_default = text(model_default) if text is not None else model_default
    choices = field_choices(model, name)
    if choices is not None and "callback" not in typer_kwargs:
        typer_kwargs["callback"] = _choice_check(primary, choices)
    info = typer.Option(cli_default, *names, help=help or _sentence(field_description(model, name)), **typer_kwargs)
    kind = annotation if annotation is not None else cli_type(field_type(model, name))
    option = ModelOption(model, name, primary, info, kind | None if given_only else kind, choices, parse, given_only, because)
    REGISTRY[id(info)] = option
    return option


def _sentence(description: str | None) -> str | None:
    return None if description is None else description[0].upper() + description[1:].rstrip(".") + "."


class OptionGroup:
    """Options that travel together into one model, declared once and added to each command that takes them."""

    def __init__(self, name: str, options: dict[str, ModelOption | Flag]) -> None:
        self.name, self.options = name, options

    def only(self, *names: str, name: str | None = None) -> "OptionGroup":
        """The same options, fewer of them, in this order (a command that takes part of the group),
        received under `name` (default: the group's)."""
        return OptionGroup(name or self.name, {option: self.options[option] for option in names})

    def fields(self, values: dict[str, Any], model: type | None = None) -> dict[str, Any]:
        """The given flag values as field values (of `model`'s fields only, when given; given-only
        flags left out when not given)."""
        return {
            option.field: option.value(values[name])
            for name, option in self.options.items()
            if isinstance(option, ModelOption)
            and name in values
            and model in (None, option.model)
            and not (option.given_only and values[name] is None)
        }

    def defaults(self) -> dict[str, Any]:
        """Every option's default by name (required ones left out): a verb that fills part of the group."""
        return {name: option.info.default for name, option in self.options.items() if option.info.default is not ...}


F = TypeVar("F", bound=Callable[..., Any])

GROUP: Any = None
"""The default of a command's group parameter (`load: dict[str, Any] = GROUP`): `with_groups` replaces it."""


def with_groups(*groups: OptionGroup) -> Callable[[F], F]:
    """Put each group's options where the command has a parameter named as the group; the command
    receives that parameter as {option name: value} (typer reads the signature this sets)."""

    def decorate(command: F) -> F:
        by_name = {group.name: group for group in groups}
        hints = typing.get_type_hints(command)
        parameters: list[inspect.Parameter] = []
        for parameter in inspect.signature(command).parameters.values():
            if parameter.name not in by_name:
                parameters.append(parameter.replace(annotation=hints.get(parameter.name, parameter.annotation)))
                continue
            parameters += [
                inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option.info, annotation=option.annotation)
                for name, option in by_name[parameter.name].options.items()
            ]

        def run(**given: Any) -> Any:
            for group in groups:
                given[group.name] = {name: given.pop(name) for name in group.options}
            return command(**given)

        run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY) for parameter in parameters]
        )
        run.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
        for attribute in ("__name__", "__qualname__", "__doc__", "__module__"):
            setattr(run, attribute, getattr(command, attribute))
        return run  # type: ignore[return-value]

    return decorate


def mismatches(command: Callable[..., Any]) -> list[str]:
    """Each way the command's options differ from the fields they set: default, choices, type, or a
    flag declared by hand for a field of a model the command's generated options set."""
    problems: list[str] = []
    models: set[type] = set()
    hand_made: list[str] = []
    for parameter in inspect.signature(command, eval_str=True).parameters.values():
        option = REGISTRY.get(id(parameter.default))
        if option is None:
            if isinstance(parameter.default, OptionInfo) and id(parameter.default) not in NAMED_LIKE_A_FIELD:
                hand_made.append(parameter.name)
            continue
        models.add(option.model)
        problems += _field_mismatches(parameter, option)
    for name in hand_made:
        owners = [model.__name__ for model in models if name in field_names(model)]
        if owners:
            problems.append(f"--{name.replace('_', '-')}: declared by hand, but it is {owners[0]}.{name}; use model_option")
    return problems


def _field_mismatches(parameter: inspect.Parameter, option: ModelOption) -> list[str]:
    where = f"{option.flag} ({option.model.__name__}.{option.field})"
    info: OptionInfo = parameter.default
    problems = []
    expected = field_default(option.model, option.field)
    if option.given_only:
        if info.default is not None:
            problems.append(f"{where}: default {info.default!r}, but a given-only flag defaults to None")
    elif expected is not ... and option.because is None and option.value(info.default) != expected:
        problems.append(f"{where}: default {info.default!r}, the field's is {expected!r}")
    if option.choices != field_choices(option.model, option.field):
        problems.append(f"{where}: choices {option.choices}, the field's are {field_choices(option.model, option.field)}")
    if option.choices is not None and info.callback is None:
        problems.append(f"{where}: choices {option.choices} are not checked (no callback)")
    wanted = cli_type(field_type(option.model, option.field))
    declared = _without_none(parameter.annotation)
    if option.parse is None and declared != wanted:
        problems.append(f"{where}: type {declared}, the field's is {wanted}")
    return problems
