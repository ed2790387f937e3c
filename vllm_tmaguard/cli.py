"""The `tmaguard` command."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from .codes import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE
from .issue import printable
from .redaction import redact
from .stages.toggles import Toggles, read_toggles

if TYPE_CHECKING:
    from .install.wheel import Wheel

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
        _echo(f"warning: {problem.cause}; {problem.consequence}; fix: {problem.fix}", err=True)
    return toggles


def _echo(text: str, err: bool = False) -> None:
    """Prints what any stream can print (a path's undecodable bytes escaped), line by line. Raises OSError
    where the stream is closed (click would print nothing, and the command would seem to have done)."""
    if (sys.stderr if err else sys.stdout) is None:
        raise OSError(errno.EBADF, f"standard {'error' if err else 'output'} is closed")
    typer.echo("\n".join(printable(line) for line in text.split("\n")), err=err)


@app.command(short_help="What the guard would find and do here; changes nothing.")
def check(as_json: bool = typer.Option(False, "--json", help="print the record as JSON")) -> None:
    """What the guard would find and do in a vLLM process started here (changes nothing, loads nothing,
    calls nothing of the layer's). Exit status 1 where the guard would log a warning or an error."""
    from .issue import level_of, render
    from .stages.preview import preview

    toggles = _toggles()
    if toggles.mode == "off":  # the guard does nothing, writes no record: say so, not what auto would do
        nothing = "TMAGUARD_MODE=off: the guard does nothing in vLLM processes started here"
        _echo(json.dumps({"mode": "off", "record": None, "summary": nothing}) if as_json else nothing)
        raise typer.Exit(EXIT_OK)
    document = preview(os.environ, toggles, "cli").to_json()
    _echo(json.dumps(document, indent=1) if as_json else render(document))
    raise typer.Exit(EXIT_FINDINGS if level_of(document) in ("warning", "error") else EXIT_OK)


@app.command(short_help="Print the last record the guard wrote in a vLLM process.")
def record() -> None:
    """Print the last record the guard wrote in a vLLM process: read where the guard put it (its record
    directory, judged as the guard judges it), and only if it is a record (else exit status 1, and why)."""
    from .doctor.hooks import read_record
    from .doctor.record_shape import SCHEMA

    found = read_record(_toggles().record_dir)
    if found["error"] or not found["found"] or found["record"].get("schema") != SCHEMA:
        where = found["path"] or f"{found['asked']} (refused: {found['refused']})"
        missing = (
            "a record of another schema" if found["found"] else
            "no record there yet" if found["path"] else "no record directory this user may read"
        )  # fmt: skip
        why = found["error"] or f"{where}: {missing}"
        _echo(f"tmaguard record: {why}", err=True)  # an error names the file itself
        raise typer.Exit(EXIT_FINDINGS)
    _echo(json.dumps(found["record"], indent=1))


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
    from .install.env_recipe import recipe
    from .stages.facts import probe

    toggles = _toggles()
    facts = probe(os.environ, toggles.root, "cli", eager=None)  # no vLLM command line here
    lines, code = recipe(facts, dict(os.environ), install_dir or None, toggles.root)
    _echo("\n".join(lines))
    raise typer.Exit(code)


@app.command(short_help="Place the package in DIR, or in the venv that runs vLLM.")
def inject(
    target: str = typer.Argument("", metavar="DIR", help="a volume the vLLM container mounts (or --venv)"),
    venv: str = typer.Option(
        "",
        "--venv",
        metavar="VENV",
        help="into this virtual environment's site-packages instead, as pip would (e.g. llm-d's /opt/vllm)",
    ),
    wheel: str = typer.Option(
        "",
        "--wheel",
        metavar="PATH",
        help="from this wheel (or the one for this machine in this directory), not the installed copy",
    ),
) -> None:
    """Copy this package into DIR with a sitecustomize.py that arms the guard at interpreter start: the
    stock vLLM image then runs the guard with DIR on PYTHONPATH, as a pip install would (an init container's
    command; docs/operator.md). With --venv VENV, into the site-packages of the virtual environment that
    runs vLLM (found from its pyvenv.cfg and lib/pythonX.Y/site-packages), as pip would: the .pth that arms
    the guard in its python, the `tmaguard` command in its bin/, a RECORD. With --wheel, the files come from
    the wheel's bytes (its RECORD checked), as the zero-image init container does from the wheel ConfigMap;
    where TMAGUARD_WHEEL_SHA256 is set, only a wheel whose sha256 it lists is placed."""
    from .install.inject import InjectError, inject_wheel
    from .install.inject import inject as place
    from .install.venv import VenvError
    from .install.wheel import PIN_VARIABLE, WheelError
    from .stages.toggles import ToggleError, parse_toggles

    if bool(target) == bool(venv):
        _echo("tmaguard inject: name one place: DIR (for PYTHONPATH) or --venv VENV", err=True)
        raise typer.Exit(EXIT_USAGE)
    where = venv or target
    try:  # a bad pin refuses: falling back to none would place a wheel the operator meant to refuse
        pins = parse_toggles({PIN_VARIABLE: os.environ.get(PIN_VARIABLE, "")}).wheel_pins
        placed, source = (
            inject_wheel(wheel, where, pins, bool(venv)) if wheel else (place(where, bool(venv)), "")
        )
    except (InjectError, VenvError, WheelError, ToggleError, OSError) as error:
        why = str(error).removeprefix("refused: ")  # trust.UntrustedPath's own words say it
        _echo(f"tmaguard inject: {where}: refused: {why}", err=True)
        raise typer.Exit(EXIT_FINDINGS) from error
    if placed.tightened:
        _echo(f"tmaguard inject: {placed.tightened}")
    origin = f" from {source}" if source else ""
    if venv:
        scripts = [f for f in placed.files if f.startswith("../")]
        in_bin = f" and {', '.join(os.path.basename(s) for s in scripts)} in {venv}/bin" if scripts else ""
        _echo(
            f"placed {len(placed.files) - len(scripts)} files in {placed.target}{in_bin}{origin}; "
            f"{venv}/bin/python arms the guard at start (vllm_tmaguard.pth)"
        )
        return
    _echo(
        f"placed {len(placed.files)} files in {target}{origin}; in the vLLM container set PYTHONPATH={target}"
    )


@app.command(short_help="Add the guard to vLLM pods in YAML (Helm post-renderer).")
def manifests(
    container: Annotated[
        list[str] | None,
        typer.Option(
            "--container", metavar="NAME", help="the containers so named run vLLM, no others (repeatable)"
        ),
    ] = None,
    wheel: Annotated[
        list[str] | None,
        typer.Option(
            "--wheel", metavar="PATH", help="add a ConfigMap of this wheel and mount it (repeatable)"
        ),
    ] = None,
    python: str = typer.Option(
        "",
        "--python",
        metavar="PATH",
        help="the Python that runs vLLM in the image (default: the one the vLLM container's command names, "
        "e.g. /opt/vllm/bin/python3 after `source /opt/vllm/bin/activate`, else python3)",
    ),
) -> None:
    """Read Kubernetes YAML on stdin (helm template, kubectl get -o yaml, a kustomize build) and write it back
    with the zero-image install added to every container that runs vLLM: an init container in the vLLM
    image that places the package from the wheel ConfigMap, its volumes, PYTHONPATH, the toggles ConfigMap.
    Everything else is written back byte for byte; a second run changes nothing. Use as Helm's post-renderer
    (docs/operator.md). Exit status 1 when it cannot tell which container runs vLLM: name it."""
    import sys

    from .install.manifests.postrender import HOW_TO_NAME, postrender
    from .install.manifests.stream import StreamError

    wheels = {os.path.basename(path): _checked_wheel(path).data for path in wheel or []}
    try:
        result = postrender(sys.stdin.read(), container or [], wheels, python or None)
    except (StreamError, ValueError) as error:
        _echo(f"tmaguard manifests: refused: {error}", err=True)
        raise typer.Exit(EXIT_FINDINGS) from error
    if result.refused:
        for why in result.refused:
            _echo(f"tmaguard manifests: refused: {why}", err=True)
        _echo(f"tmaguard manifests: {HOW_TO_NAME}", err=True)
        raise typer.Exit(EXIT_FINDINGS)
    sys.stdout.write(result.text)
    sys.stdout.flush()
    for where in result.guarded:
        _echo(f"tmaguard manifests: guarded {where}", err=True)


def _checked_wheel(path: str) -> Wheel:
    from .install.wheel import WheelError, read

    try:
        return read(path)
    except (WheelError, OSError) as error:
        _echo(f"tmaguard: {path}: refused: {error}", err=True)
        raise typer.Exit(EXIT_FINDINGS) from error


@app.command(name="wheel-configmap", short_help="The wheel ConfigMap of the zero-image install.")
def wheel_configmap(
    wheels: Annotated[
        list[str], typer.Argument(metavar="WHEEL", help="vllm-tmaguard wheels, one per machine")
    ],
    into: str = typer.Option(
        "",
        "--into",
        metavar="DIR",
        help="write the wheel where a kustomization's configMapGenerator reads it",
    ),
    namespace: str = typer.Option("", "--namespace", metavar="NS", help="the ConfigMap's namespace"),
) -> None:
    """Print the `tmaguard-wheel` ConfigMap (binaryData, each wheel under its file name) that the pods of
    `tmaguard manifests` mount: `tmaguard wheel-configmap dist/*.whl | kubectl apply --server-side -f -`.
    With --into DIR, write the one wheel as DIR/vllm-tmaguard.whl instead, for the configMapGenerator of
    deploy/k8s/overlays/vcuda-stock-image, and its pin as DIR/wheel-pin.yaml, the overlay's patch of the init
    container. Every wheel's RECORD is checked first; the digests to pin on the init container
    (TMAGUARD_WHEEL_SHA256) are printed on stderr."""
    from .install.manifests.configmap import wheel_configmap as make
    from .install.manifests.stream import dump
    from .install.manifests.zero_image import (
        OVERLAY_PIN,
        OVERLAY_WHEEL,
        WHEEL_CONFIGMAP,
        overlay_pin_patch,
        pin_variable,
    )
    from .install.wheel import sha256
    from .stages import door

    found = [_checked_wheel(path) for path in wheels]
    variable = pin_variable(tuple(sha256(w.data) for w in found))
    pin = f"tmaguard wheel-configmap: pin on the init container: {variable['name']}={variable['value']}"
    if into:
        if len(found) != 1:
            _echo("tmaguard wheel-configmap: --into takes one wheel (the one for your nodes)", err=True)
            raise typer.Exit(EXIT_USAGE)
        pinned = overlay_pin_patch((sha256(found[0].data),)).encode()
        try:
            written = door.install_file(into, OVERLAY_WHEEL, found[0].data, 0o644)
            pin_file = door.install_file(into, OVERLAY_PIN, pinned, 0o644)
        except OSError as error:
            _echo(f"tmaguard wheel-configmap: {into}: refused: {error}", err=True)
            raise typer.Exit(EXIT_FINDINGS) from error
        _echo(f"wrote {written} ({found[0].machine or 'any machine'}, vllm-tmaguard {found[0].version})")
        _echo(f"pinned in {pin_file} (the init container's {variable['name']})")
        _echo(pin, err=True)
        return
    try:
        document = make(WHEEL_CONFIGMAP, {os.path.basename(w.path): w.data for w in found}, namespace, False)
    except ValueError as error:
        _echo(f"tmaguard wheel-configmap: refused: {error}", err=True)
        raise typer.Exit(EXIT_FINDINGS) from error
    typer.echo(dump(document), nl=False)
    _echo(pin, err=True)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
    short_help="Why vLLM fails on this pod, and the exact fix.",
)
def doctor(ctx: typer.Context) -> None:
    """Why vLLM fails (or would fail) on this pod, and the exact fix (`tmaguard doctor --help`)."""
    from .doctor import main as doctor_main

    raise typer.Exit(doctor_main(list(ctx.args)))


def _usage_error(error: Exception) -> bool:
    return any(cls.__name__ in ("ClickException", "Abort") for cls in type(error).__mro__) and hasattr(
        error, "show"
    )


def main() -> None:
    """The command; exit statuses as codes.EXIT_* (usage errors: click's 2). A failure of ours is said in
    one line with its own status, never a traceback or a status a finding has."""
    try:
        status = app(standalone_mode=False)  # click returns an Exit's status here
    except Exception as error:
        if _usage_error(error):  # click's (typer vendors its own copy, hence no isinstance)
            error.show()  # type: ignore[attr-defined]
            raise SystemExit(EXIT_USAGE) from None
        with contextlib.suppress(Exception):  # where stderr itself fails, the status alone says it
            _echo(redact(f"tmaguard: internal error: {type(error).__name__}: {error}"), err=True)
        raise SystemExit(EXIT_INTERNAL) from None
    raise SystemExit(status if isinstance(status, int) else EXIT_OK)


if __name__ == "__main__":
    main()
