"""Command-line wiring only: each verb lives in its own package and registers itself.

Every package that offers verbs exposes `register(app: typer.Typer) -> None` in a
module named in `VERB_MODULES`. Keeping the list here (rather than discovering it)
makes the CLI's surface explicit and reviewable.
"""

from __future__ import annotations

import importlib
import sys

import typer

from vlmserve import __version__
from vlmserve.errors import UserError

VERB_MODULES: list[str] = [
    # one line per verb package; keep alphabetical to avoid merge churn
    "vlmserve.cli.batch",
    "vlmserve.cli.bench",
    "vlmserve.cli.consistency",
    "vlmserve.cli.engine",
    "vlmserve.cli.export",
    "vlmserve.cli.gateway",
    "vlmserve.cli.model",
    "vlmserve.cli.observe",
    "vlmserve.cli.plan",
    "vlmserve.cli.recipe",
    "vlmserve.cli.report",
    "vlmserve.cli.up",
    "vlmserve.cli.sweep",
    "vlmserve.cli.slo_search",
]

app = typer.Typer(
    name="vlmserve",
    help="Take a vision-language model from weights on disk to a service that is proven deployable.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help, for every verb (the root's mode reaches each command): rich's option
    # table cuts long flag names ("--input-len,--ra…") at 80 columns; click's wraps the help text
    # and keeps every name whole (tests/unit/test_help_width.py)
    rich_markup_mode=None,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"vlmserve {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """vlmserve: up, recipe, gateway, bench, sweep, report, plan, engine sim, batch."""


_registered = False


def build_app() -> typer.Typer:
    """Import every verb module and let it attach its commands (once per process).

    Tests call `main` many times in one process; registering again would stack duplicate
    commands and make every call slower.
    """
    global _registered
    if not _registered:
        for module_name in VERB_MODULES:
            importlib.import_module(module_name).register(app)
        _registered = True
    return app


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: user errors become one line and a non-zero exit."""
    build_app()
    try:
        returned = app(args=argv, standalone_mode=False)
    except UserError as err:
        typer.echo(f"error: {err.message}", err=True)
        sys.exit(err.exit_code)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as err:  # click usage errors carry their own message and exit code
        import click

        usage_errors: tuple[type[Exception], ...] = (click.exceptions.ClickException,)
        try:  # newer typer raises its own vendored copy of click's exceptions
            from typer._click.exceptions import ClickException as TyperClickException

            usage_errors += (TyperClickException,)
        except ImportError:
            pass
        if isinstance(err, usage_errors):
            err.show()  # type: ignore[attr-defined]
            sys.exit(err.exit_code)  # type: ignore[attr-defined]
        raise
    if isinstance(returned, int) and returned != 0:  # typer.Exit(n) inside a command returns n here
        sys.exit(returned)


if __name__ == "__main__":
    main()
