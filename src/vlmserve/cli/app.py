"""Command-line wiring only: each verb lives in its own package and registers itself.

Every package that offers verbs exposes `register(app: typer.Typer) -> None` in a
module named in `VERB_MODULES`. Keeping the list here (rather than discovering it)
makes the CLI's surface explicit and reviewable.

A command line that names its verb imports that verb's module only (`VERB_COMMANDS`): the
others pull in pydantic models, the hardware tables and the results store, a third of a
second that every `vlmserve engine sim` replica, every `vlmserve status` and every script
calling the CLI would pay for nothing. `--help`, `--version` and an unknown verb build the
whole app, so the root help and click's suggestions list every verb.
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
    "vlmserve.cli.tune",
    "vlmserve.cli.vllm_bench",
]

VERB_COMMANDS: dict[str, str] = {
    # top-level command -> the module (in VERB_MODULES) that registers it; tests/unit/test_cli_verbs.py
    # checks this against what each module really registers
    "batch": "vlmserve.cli.batch",
    "bench": "vlmserve.cli.bench",
    "runs": "vlmserve.cli.bench",
    "consistency": "vlmserve.cli.consistency",
    "engine": "vlmserve.cli.engine",
    "export": "vlmserve.cli.export",
    "gateway": "vlmserve.cli.gateway",
    "model": "vlmserve.cli.model",
    "observe": "vlmserve.cli.observe",
    "plan": "vlmserve.cli.plan",
    "recipe": "vlmserve.cli.recipe",
    "compare": "vlmserve.cli.report",
    "report": "vlmserve.cli.report",
    "demo": "vlmserve.cli.up",
    "down": "vlmserve.cli.up",
    "status": "vlmserve.cli.up",
    "up": "vlmserve.cli.up",
    "sweep": "vlmserve.cli.sweep",
    "slo-search": "vlmserve.cli.slo_search",
    "tune": "vlmserve.cli.tune",
    "vllm-bench": "vlmserve.cli.vllm_bench",
}


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"vlmserve {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """vlmserve: up, recipe, gateway, bench, sweep, report, plan, engine sim, batch."""


def _new_root() -> typer.Typer:
    """The root command with no verbs yet (the whole app and each one-verb app start from it)."""
    root = typer.Typer(
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
    root.callback()(_root)
    return root


app = _new_root()

_registered = False
_verb_apps: dict[str, typer.Typer] = {}


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


def _verb_app(module_name: str) -> typer.Typer:
    """The root with one verb module's commands only (once per process and module)."""
    if module_name not in _verb_apps:
        root = _new_root()
        importlib.import_module(module_name).register(root)
        _verb_apps[module_name] = root
    return _verb_apps[module_name]


def app_for(argv: list[str]) -> typer.Typer:
    """The app that parses `argv`: the named verb's alone, unless the whole app is built already
    (in-process callers such as the tests build it once) or no known verb is named."""
    verb = next((arg for arg in argv if not arg.startswith("-")), None)
    if verb is None and "--version" in argv and "--help" not in argv:
        return _new_root()  # the version alone needs no verb
    if _registered or verb not in VERB_COMMANDS:
        return build_app()
    return _verb_app(VERB_COMMANDS[verb])


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: user errors become one line and a non-zero exit."""
    app = app_for(sys.argv[1:] if argv is None else argv)
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
