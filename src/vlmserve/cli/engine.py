"""`vlmserve engine sim`: start a simulated vLLM engine (OpenAI API, vLLM metrics, no GPU)."""

from __future__ import annotations

from typing import Any

import typer

from vlmserve.cli.engine_options import SIM_ENGINE
from vlmserve.cli.model_options import GROUP, with_groups

engine_app = typer.Typer(
    name="engine", help="Inference engines vlmserve can run itself (the simulated engine).", no_args_is_help=True
)


@engine_app.command("sim")
@with_groups(SIM_ENGINE)
def sim(flags: dict[str, Any] = GROUP) -> None:
    """Start a simulated vLLM engine: OpenAI API, vLLM metrics, timed by vLLM's scheduler rules."""
    from vlmserve.engines.sim.options import FaultOptions, SimEngineConfig
    from vlmserve.engines.sim.server import run_server

    fields = SIM_ENGINE.fields(flags, SimEngineConfig)
    extra_names = flags["served_model_name"]
    config = SimEngineConfig(
        **fields,
        served_model_names=tuple([fields["model"], *extra_names]) if extra_names else (),
        enable_prefix_caching=not flags["no_prefix_caching"],
        enable_chunked_prefill=not flags["no_chunked_prefill"],
        record_timing=not flags["no_timing"],
        faults=FaultOptions(**SIM_ENGINE.fields(flags, FaultOptions)),
    )
    run_server(config)


def register(app: typer.Typer) -> None:
    app.add_typer(engine_app, name="engine")
