"""Every CLI flag that sets a model field says what the field says: its default, its choices, its type.

The flags are generated from the fields (cli.model_options); this walks every command of the app
and holds each generated option against its field as the field is now, so a default changed in a
model, or a flag declared by hand beside generated ones, fails here. The last tests prove the
check catches each kind of difference.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest
import typer

from vlmserve.cli.app import build_app
from vlmserve.cli.bench_options import BENCH, SEARCH_REPEAT
from vlmserve.cli.gateway_options import GATEWAY
from vlmserve.cli.model_options import REGISTRY, ModelOption, choices_text, cli_type, field_default, mismatches, model_option
from vlmserve.errors import UserError
from vlmserve.gateway.config import ENV_ONLY_SETTINGS, GatewayConfig, config_argv
from vlmserve.spec import LoadSpec


def _commands(app: typer.Typer, prefix: str = "") -> Iterator[tuple[str, Callable[..., Any]]]:
    if app.registered_callback is not None and app.registered_callback.callback is not None:
        yield prefix.strip() or "vlmserve", app.registered_callback.callback  # a group's own options (`plan`)
    for command in app.registered_commands:
        assert command.callback is not None
        yield f"{prefix}{command.name or command.callback.__name__}", command.callback
    for group in app.registered_groups:
        assert group.typer_instance is not None
        yield from _commands(group.typer_instance, f"{prefix}{group.name} ")


COMMANDS = dict(_commands(build_app()))


def _generated(command: Callable[..., Any]) -> list[ModelOption]:
    return [
        REGISTRY[id(parameter.default)]
        for parameter in inspect.signature(command).parameters.values()
        if id(parameter.default) in REGISTRY
    ]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_says_what_its_field_says(name: str) -> None:
    assert mismatches(COMMANDS[name]) == []


@pytest.mark.parametrize(
    ("name", "least"),
    [
        ("bench", 40),
        ("tune", 15),
        ("slo-search", 17),
        ("gateway", 44),
        ("engine sim", 45),
        ("up", 30),
        ("plan", 12),
        ("plan search", 7),
        ("consistency", 9),
    ],
)
def test_the_option_groups_are_generated(name: str, least: int) -> None:
    """The walk above checks something: these commands' flags come from their models."""
    assert len(_generated(COMMANDS[name])) >= least


def test_tune_and_slo_search_take_the_bench_flags_themselves() -> None:
    """Declared once: the load flags of tune and slo-search are bench's own option objects (and --repeat
    their shared one, LoadSpec.repeat at the searches' own default)."""
    bench_infos = {id(option.info) for option in (*BENCH.options.values(), SEARCH_REPEAT)}
    for name in ("tune", "slo-search"):
        assert {id(option.info) for option in _generated(COMMANDS[name])} <= bench_infos


def test_a_literal_field_refuses_other_values_in_one_line() -> None:
    dataset = BENCH.options["dataset"]
    assert isinstance(dataset, ModelOption) and dataset.choices == ("random", "sharegpt", "images", "mixed", "trace")
    with pytest.raises(UserError, match="--dataset 'tweets': use one of random, sharegpt, images, mixed, trace"):
        dataset.info.callback("tweets")  # type: ignore[misc]
    with pytest.raises(UserError, match="--api 'grpc': use one of chat, completions"):
        BENCH.fields({"api": "grpc"})
    assert choices_text(LoadSpec, "arrival") == "poisson (default), constant or gamma"  # help from the field too


def test_a_flag_not_given_leaves_the_field_at_its_default() -> None:
    """Given-only flags (None: not given) are left out, so LoadSpec's default applies, not a copy of it."""
    fields = BENCH.fields({"arrival": None, "input_len": None, "image_size": "32x16", "duration": "2m"})
    assert fields == {"image_size": (32, 16), "duration_s": 120.0}
    assert LoadSpec(rate=1, num_requests=1, **fields).arrival == field_default(LoadSpec, "arrival")


def _other_value(option: ModelOption) -> Any:
    """A value of the setting's flag type that is not its default."""
    default = field_default(option.model, option.field)
    kind = cli_type(option.annotation)
    if isinstance(default, bool):
        return not default
    if isinstance(default, list) or default is ...:
        return ["http://127.0.0.1:9001", "http://127.0.0.1:9002"] if option.field == "replicas" else ["a.example", "b.example"]
    if kind is Path:
        return Path("/srv/vlm") / option.field
    if kind is int:
        return (default or 16) + 1
    if kind is float:
        return (default or 1.0) * 2 + 0.5
    return "closed" if option.field == "state_unavailable" else f"{option.field}-value"


def test_a_gateway_config_written_as_flags_reads_back_the_same() -> None:
    """`vlmserve up` starts its gateway with config_argv(config): every setting with a flag survives the trip."""
    settings = {
        name: option
        for name, option in GATEWAY.options.items()
        if isinstance(option, ModelOption) and option.field not in ENV_ONLY_SETTINGS
    }
    config = GatewayConfig(**{option.field: _other_value(option) for option in settings.values()})
    command = typer.main.get_command(build_app()).commands["gateway"]  # type: ignore[attr-defined]
    context = command.make_context("gateway", config_argv(config))
    assert GatewayConfig(**GATEWAY.fields(context.params)) == config
    assert config_argv(GatewayConfig(replicas=["http://a:1"])) == ["--replica", "http://a:1"]


# ---- the check catches each kind of difference ---------------------------------------------------


def test_a_default_that_differs_from_the_field_is_caught() -> None:
    warmup = model_option(LoadSpec, "warmup", help="Requests left out.")
    warmup.info.default = 5

    def wrong(warmup: int = warmup.info) -> None: ...

    assert mismatches(wrong) == ["--warmup (LoadSpec.warmup): default 5, the field's is 0"]


def test_a_type_that_differs_from_the_field_is_caught() -> None:
    seed = model_option(LoadSpec, "seed", help="Seed.")

    def wrong(seed: float = seed.info) -> None: ...

    assert mismatches(wrong) == ["--seed (LoadSpec.seed): type <class 'float'>, the field's is <class 'int'>"]


def test_choices_that_differ_from_the_field_are_caught() -> None:
    api = model_option(LoadSpec, "api", help="chat or completions.")
    REGISTRY[id(api.info)] = dataclasses.replace(api, choices=("chat",))
    unchecked = model_option(LoadSpec, "image_format", help="png or jpeg.")
    unchecked.info.callback = None

    def wrong(api: str = api.info, image_format: str = unchecked.info) -> None: ...

    assert mismatches(wrong) == [
        "--api (LoadSpec.api): choices ('chat',), the field's are ('chat', 'completions')",
        "--image-format (LoadSpec.image_format): choices ('png', 'jpeg') are not checked (no callback)",
    ]


def test_a_flag_declared_by_hand_beside_generated_ones_is_caught() -> None:
    dataset = model_option(LoadSpec, "dataset", help="The workload.")

    def wrong(
        dataset: str = dataset.info,
        api: str = typer.Option("completions", "--api"),
        label: Optional[str] = typer.Option(None, "--label"),
    ) -> None: ...

    assert mismatches(wrong) == ["--api: declared by hand, but it is LoadSpec.api; use model_option"]


# ---- a value outside a field's choices, on each generated verb: one line, exit 2 ------------------


@pytest.mark.hostile("a choice flag (bench, up, engine sim) given a value outside its field's Literal")
@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            [
                "bench",
                "--base-url",
                "http://127.0.0.1:9",
                "--model",
                "m",
                "--concurrency",
                "1",
                "--num-requests",
                "1",
                "--arrival",
                "bursty",
            ],
            "error: --arrival 'bursty': use one of poisson, constant, gamma",
        ),
        (
            ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--dataset-name", "tweets"],
            "error: --dataset 'tweets': use one of random, sharegpt, images, mixed, trace",
        ),
        (["up", "--devices", "tpu", "--print-plan"], "error: --devices 'tpu': use one of auto, cpu, gpu"),
    ],
)
def test_a_value_outside_the_choices_is_one_line(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    from vlmserve.cli.app import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.strip() == line and "Traceback" not in err
