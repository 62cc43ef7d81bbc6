"""The CLI imports only the verb a command line names (vlmserve.cli.app.VERB_COMMANDS): the map must
name, for every top-level command, the module that really registers it, or that command would be
"No such command" when run on its own."""

from __future__ import annotations

import importlib

import typer
import typer.main

from vlmserve.cli import app as cli_app


def registered_by(module_name: str) -> set[str]:
    probe = typer.Typer()
    probe.callback()(lambda: None)  # a group, as the real root is (one command would collapse into it)
    importlib.import_module(module_name).register(probe)
    return set(getattr(typer.main.get_command(probe), "commands", {}))


def test_every_command_maps_to_the_module_that_registers_it() -> None:
    really = {name: module for module in cli_app.VERB_MODULES for name in registered_by(module)}
    assert cli_app.VERB_COMMANDS == really


def test_a_named_verb_gets_an_app_with_that_verb_alone(monkeypatch) -> None:
    monkeypatch.setattr(cli_app, "_registered", False)
    monkeypatch.setattr(cli_app, "_verb_apps", {})
    commands = set(getattr(typer.main.get_command(cli_app.app_for(["status", "--json"])), "commands", {}))
    assert commands == {"demo", "down", "status", "up"}
    version_only = typer.main.get_command(cli_app.app_for(["--version"]))
    assert not getattr(version_only, "commands", {})


def test_help_and_unknown_verbs_get_every_verb(monkeypatch) -> None:
    whole = cli_app.build_app()
    assert set(getattr(typer.main.get_command(whole), "commands", {})) == set(cli_app.VERB_COMMANDS)
    monkeypatch.setattr(cli_app, "_registered", False)
    monkeypatch.setattr(cli_app, "build_app", lambda: whole)
    for argv in (["--help"], [], ["no-such-verb"], ["--version", "--help"]):
        assert cli_app.app_for(argv) is whole, argv
