"""The `tmaguard` command."""

from __future__ import annotations

import json
import os

import typer

from .toggles import ToggleError, parse_toggles

app = typer.Typer(add_completion=False, no_args_is_help=True, help="vllm-tmaguard: vLLM on GPU-sharing pods.")


@app.command()
def check(as_json: bool = typer.Option(False, "--json", help="print the record as JSON")) -> None:
    """What the guard would find and do in a vLLM process started here (changes nothing)."""
    from .actions import Outcome
    from .decision import decide
    from .facts import probe
    from .record import build_record, render_text

    try:
        toggles = parse_toggles(os.environ)
    except ToggleError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    facts = probe(os.environ, toggles.root, "cli")
    decision = decide(facts, toggles)
    record = build_record(facts, decision, Outcome(), "validate", 0.0)
    typer.echo(json.dumps(record, indent=1) if as_json else render_text(record))
    raise typer.Exit(1 if decision.problem or decision.warnings else 0)


@app.command()
def record() -> None:
    """Print the last record the guard wrote in a vLLM process."""
    try:
        toggles = parse_toggles(os.environ)
    except ToggleError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    path = os.path.join(toggles.record_dir, "last.json")
    try:
        with open(path) as file:
            typer.echo(file.read().rstrip())
    except OSError as error:
        typer.echo(f"no record at {path}: {error.strerror}", err=True)
        raise typer.Exit(1) from None


def main() -> None:
    app()
