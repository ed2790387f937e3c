"""A virtual environment as `tmaguard inject --venv` reads it, passively (its files, never its Python run):
the site-packages its python reads .pth files from, and what pip would write there and in its bin/ for this
package. llm-d's images run vLLM from a venv at /opt/vllm (`uv venv`, no pip in it).

A venv is a directory with a pyvenv.cfg (`home = ...`, written by `python -m venv`, virtualenv and uv) and,
on Linux, lib/pythonX.Y/site-packages (lib/pythonX.Yt for a free-threaded build, lib/pypyX.Y for PyPy).
Its python reads lib/python{its own X.Y}: where lib/ holds more than one, pyvenv.cfg's `version` (venv) or
`version_info` (virtualenv, uv) says which; where nothing says, it is refused, never guessed."""

from __future__ import annotations

import base64
import configparser
import csv
import hashlib
import io
import os
import re
from collections.abc import Iterable
from typing import NamedTuple

from .. import files
from ..stages import door

CONFIG = "pyvenv.cfg"
_CONFIG_LIMIT = 64 << 10
_LIB_ENTRY = re.compile(r"^(?:python|pypy)(\d+)\.(\d+)t?$")
_VERSION = re.compile(r"^\s*(\d+)\.(\d+)")
_SCRIPT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a file in bin/, nothing else
_DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")  # what the script's import line may name
# What pip writes in a dist-info about its own install, not the package's (an installed copy has them).
INSTALLER_FILES = ("INSTALLER", "REQUESTED", "direct_url.json")
EXPECTED = f"a {CONFIG} with a `home = ...` line, bin/python and lib/pythonX.Y/site-packages beside it"
DIST_INFO_PREFIX = "vllm_tmaguard-"


class VenvError(ValueError):
    """Not a virtual environment, or one whose site-packages cannot be told: the message names the
    directory, what was found and what was expected."""


class Venv(NamedTuple):
    site_packages: str
    bin: str
    python: str  # bin/python, absolute: what a console script's first line names


def parse_config(text: str) -> dict[str, str]:
    """pyvenv.cfg's `key = value` lines (keys lower-cased), read as Python's site.py reads them."""
    config = {}
    for line in text.splitlines():
        key, equals, value = line.partition("=")
        if equals:
            config[key.strip().lower()] = value.strip()
    return config


def choose_site(venv: str, config: dict[str, str], entries: Iterable[str]) -> str:
    """The lib/ entry (pythonX.Y) whose site-packages the venv's python reads, from `entries` (the lib/
    entries that hold a site-packages directory) and pyvenv.cfg's version. Raises VenvError."""
    candidates = sorted(e for e in entries if _LIB_ENTRY.match(e))
    found = ", ".join(f"lib/{c}/site-packages" for c in candidates)
    if "home" not in config:
        raise VenvError(f"{venv}: not a virtual environment: its {CONFIG} has no `home = ...` ({EXPECTED})")
    if not candidates:
        raise VenvError(f"{venv}: not a virtual environment: no lib/pythonX.Y/site-packages ({EXPECTED})")
    said = config.get("version_info") or config.get("version") or ""
    version = _VERSION.match(said)
    if version:
        wanted = [c for c in candidates if (m := _LIB_ENTRY.match(c)) and m.groups() == version.groups()]
        if len(wanted) == 1:
            return wanted[0]
        if not wanted:
            raise VenvError(
                f"{venv}: its {CONFIG} says Python {said}, but there is no "
                f"lib/python{'.'.join(version.groups())}/site-packages (found: {found})"
            )
        candidates = wanted
    elif len(candidates) == 1:
        return candidates[0]
    raise VenvError(
        f"{venv}: more than one site-packages ({found}) and its {CONFIG} names no version that picks one: "
        "remove the one its python does not read, or install with that python's pip"
    )


def find(venv: str) -> Venv:
    """The venv at `venv` (its directory, as `python -m venv DIR` named it), read from its files alone.
    Raises VenvError."""
    config_path = os.path.join(venv, CONFIG)
    if not door.is_directory(venv):
        parent = os.path.dirname(os.path.dirname(os.path.abspath(venv)))
        inside = door.exists(os.path.join(parent, CONFIG))
        hint = f" (name the environment's directory, {parent})" if inside else ""
        raise VenvError(f"{venv}: not a virtual environment: not a directory{hint} ({EXPECTED})")
    try:
        text = files.read_bytes(config_path, _CONFIG_LIMIT, noted=False).decode("utf-8", "replace")
    except FileNotFoundError:
        raise VenvError(f"{venv}: not a virtual environment: no {CONFIG} in it ({EXPECTED})") from None
    except OSError as error:
        raise VenvError(f"{config_path}: not a venv's {CONFIG}: {error}") from None
    lib = os.path.join(venv, "lib")
    try:
        names = door.listdir(lib)
    except OSError:
        names = []
    entries = [n for n in names if door.is_directory(os.path.join(lib, n, "site-packages"))]
    chosen = choose_site(venv, parse_config(text), entries)
    python = os.path.join(os.path.abspath(venv), "bin", "python")
    if not door.exists(python):
        raise VenvError(f"{venv}: not a virtual environment: no bin/python (or a dead link) ({EXPECTED})")
    return Venv(os.path.join(lib, chosen, "site-packages"), os.path.join(venv, "bin"), python)


def others_installed(names: Iterable[str], dist_info: str) -> list[str]:
    """The entries of site-packages (`names`) that are another install of this package than the one whose
    dist-info is `dist_info` (another version's dist-info or egg-info, an editable install's hook)."""
    return sorted(
        n for n in names
        if (n.startswith(DIST_INFO_PREFIX) and n.endswith((".dist-info", ".egg-info")) and n != dist_info)
        or (n.startswith("__editable__") and "vllm_tmaguard" in n)
        or n in ("vllm_tmaguard.egg-link", "vllm_tmaguard.egg-info")
    )  # fmt: skip


def console_scripts(entry_points: str) -> dict[str, tuple[str, str]]:
    """{name: (module, function)} of the [console_scripts] section of a dist-info's entry_points.txt; an
    entry whose name is no plain file name, or whose target is no dotted name, is left out."""
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(entry_points)
    except configparser.Error:
        return {}
    scripts = {}
    for name, value in parser["console_scripts"].items() if parser.has_section("console_scripts") else ():
        module, _, function = (part.strip() for part in value.partition(":"))
        function = function.split("[")[0].strip()  # extras, as in `a.b:c [extra]`
        if _SCRIPT_NAME.match(name) and _DOTTED.match(module) and _DOTTED.match(function):
            scripts[name] = (module, function)
    return scripts


def script(python: str, module: str, function: str) -> bytes:
    """The console script pip writes for an entry point (pip's own template), run by the venv's python."""
    return (
        f"#!{python}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom {module} import {function}\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        f"    sys.exit({function}())\n"
    ).encode()


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def record(written: Iterable[tuple[str, bytes]], record_path: str) -> bytes:
    """The dist-info's RECORD as pip writes it after an install: every file written (paths relative to
    site-packages; a script in bin/ as ../../../bin/NAME) with its sha256 and size, RECORD itself last,
    unhashed. `pip uninstall` then removes exactly what was placed."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for relative, data in sorted(written):
        if relative != record_path:
            writer.writerow([relative, _digest(data), len(data)])
    writer.writerow([record_path, "", ""])
    return out.getvalue().encode()
