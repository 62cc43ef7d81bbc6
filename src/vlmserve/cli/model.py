"""`vlmserve model ...`: make and locate the embedded tiny VLM."""

from __future__ import annotations

from pathlib import Path

import typer

model_app = typer.Typer(help="The embedded tiny VLM: make it, find it.", no_args_is_help=True)


@model_app.command("make-tiny")
def make_tiny(out: Path = typer.Option(..., "--out", help="Directory to write the model into (must be new or empty).")) -> None:
    """Write the embedded tiny Idefics3 VLM (random weights, real tokenizer and processor) to DIR."""
    from vlmserve.engines.embedded import make_tiny_model

    written = make_tiny_model(out)
    typer.echo(str(written))


@model_app.command("path")
def path() -> None:
    """Print the cached embedded model's directory, making it first if needed."""
    from vlmserve.engines.embedded import ensure_tiny_model

    typer.echo(str(ensure_tiny_model()))


@model_app.command("adapters")
def adapters(count: int = typer.Option(8, "--count", min=1, max=64, help="How many adapters (1-64).")) -> None:
    """Print NAME=DIR of the embedded model's first COUNT LoRA adapters, making them first if needed."""
    from vlmserve.engines.embedded_adapters import ensure_adapters

    for name, path in ensure_adapters(count).items():
        typer.echo(f"{name}={path}")


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
