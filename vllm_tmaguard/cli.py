"""The `tmaguard` command."""

from __future__ import annotations

import json
import os

import typer

from .toggles import Toggles, read_toggles

# Plain (click-style) help: typer's rich panels print a value type even for flags ("--help <bool>").
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="vllm-tmaguard: vLLM on GPU-sharing pods.",
)


def _toggles() -> Toggles:
    """The toggles as the guard reads them: a bad one at its default, said on stderr (never a stop: the
    preflight's `tmaguard env` must install the overlay whatever a routing or logging setting says)."""
    toggles, problems = read_toggles(os.environ)
    for problem in problems:
        typer.echo(f"warning: {problem.cause}; {problem.consequence}; fix: {problem.fix}", err=True)
    return toggles


@app.command(short_help="What the guard would find and do here; changes nothing.")
def check(as_json: bool = typer.Option(False, "--json", help="print the record as JSON")) -> None:
    """What the guard would find and do in a vLLM process started here (changes nothing, loads nothing,
    calls nothing of the layer's)."""
    from .preview import preview
    from .record import level_of, render_line

    toggles = _toggles()
    record = preview(os.environ, toggles, "cli")
    typer.echo(json.dumps(record.to_json(), indent=1) if as_json else render_line(record))
    raise typer.Exit(1 if level_of(record) == "warning" else 0)


@app.command(short_help="Print the last record the guard wrote in a vLLM process.")
def record() -> None:
    """Print the last record the guard wrote in a vLLM process."""
    toggles = _toggles()
    path = os.path.join(toggles.record_dir, "last.json")
    try:
        with open(path) as file:
            typer.echo(file.read().rstrip())
    except OSError as error:
        typer.echo(f"no record at {path}: {error.strerror}", err=True)
        raise typer.Exit(1) from None


@app.command(short_help="The overlay installed once per container, for the manifest.")
def env(
    install_dir: str = typer.Option(
        "",
        "--install-dir",
        metavar="DIR",
        help="write the overlay there as libcuda.so.1 (once per container, before vLLM)",
    ),
) -> None:
    """The manifest-level fix where the guard cannot load its overlay in-process (something loads
    libcuda.so.1 first): the overlay installed once per container, its directory first on LD_LIBRARY_PATH."""
    from .env_recipe import recipe
    from .facts import probe

    toggles = _toggles()
    facts = probe(os.environ, toggles.root, "cli")
    lines, code = recipe(facts, dict(os.environ), install_dir or None)
    typer.echo("\n".join(lines))
    raise typer.Exit(code)


@app.command(short_help="Place the package in DIR for the stock vLLM image (no rebuild).")
def inject(
    target: str = typer.Argument(..., metavar="DIR", help="a volume the vLLM container mounts"),
) -> None:
    """Copy this package into DIR with a sitecustomize.py that arms the guard at interpreter start: the
    stock vLLM image then runs the guard with DIR on PYTHONPATH, as a pip install would (an init container's
    command; docs/operator.md)."""
    from .inject import InjectError
    from .inject import inject as place

    try:
        written = place(target)
    except (InjectError, OSError) as error:
        typer.echo(f"tmaguard inject: {target}: {error}", err=True)
        raise typer.Exit(1) from error
    typer.echo(f"placed {len(written)} files in {target}; in the vLLM container set PYTHONPATH={target}")


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
    short_help="Why vLLM fails on this pod, and the exact fix.",
)
def doctor(ctx: typer.Context) -> None:
    """Why vLLM fails (or would fail) on this pod, and the exact fix (`tmaguard doctor --help`)."""
    from .doctor import main as doctor_main

    raise typer.Exit(doctor_main(list(ctx.args)))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
