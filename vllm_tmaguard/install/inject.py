"""The no-rebuild install (docs/operator.md): this package copied into a directory that the stock vLLM image
gets on PYTHONPATH, with a sitecustomize.py that arms the import hook at interpreter start. A pip install's
vllm_tmaguard.pth does that from site-packages; Python reads .pth files only there, not from PYTHONPATH.
The platform-plugin entry point is found through the copied dist-info (importlib.metadata reads sys.path).

  1. copy the installed distribution's files (no .pth, no console script) into the directory, through the
     door's install writes (nothing followed through a link planted in the directory);
  2. write sitecustomize.py: arm the hook, then run the sitecustomize.py it shadows, if the image has one.

Into a virtual environment (`inject --venv`, llm-d's /opt/vllm: venv.py finds its site-packages) it places
what pip would: the files, the .pth (its python reads .pth files there), the console script in its bin/
and a RECORD of all of them (`pip uninstall` removes them); no sitecustomize.py.

The same files come from the wheel's bytes alone (`inject --wheel`, wheel.py) where the package is not
installed: the zero-image init container runs this module from the wheel itself (zipimport) in the stock
vLLM image's Python, and places what a pip install of that wheel would have put in site-packages."""

import os
import stat
from collections.abc import Iterable, Iterator
from importlib import metadata
from typing import NamedTuple

from .. import files
from ..stages import door, trust
from ..stages.catalogue import PACKAGE_DIR

DISTRIBUTION = "vllm-tmaguard"
_FILE_LIMIT = 64 << 20

SITECUSTOMIZE = """\
# Written by `tmaguard inject` (vllm-tmaguard): arms the guard's import hook at interpreter start, as the pip
# install's vllm_tmaguard.pth does from site-packages, then runs the sitecustomize.py this one shadows.
try:
    import vllm_tmaguard._import_hook  # noqa: F401
except Exception:  # fail open: vLLM starts as it would without the guard
    pass


def _run_shadowed() -> None:
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        path = os.path.join(os.path.abspath(entry or "."), "sitecustomize.py")
        if os.path.dirname(path) != here and os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_sitecustomize_shadowed", path)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_run_shadowed()
del _run_shadowed
"""


class InjectError(RuntimeError):
    pass


def _installed_distribution(package_dir: str) -> metadata.Distribution:
    """The installed distribution whose files are this very package (not a source tree's egg-info that
    happens to be on sys.path)."""
    for distribution in metadata.distributions(name=DISTRIBUTION):
        init = distribution.locate_file("vllm_tmaguard/__init__.py")
        if os.path.realpath(str(init)) == os.path.join(package_dir, "__init__.py") and distribution.files:
            return distribution
    raise InjectError(f"no installed {DISTRIBUTION} owns {package_dir}: install the wheel, then inject")


def installed_entries(package_dir: str) -> Iterator[tuple[str, bytes, int]]:
    """(relative path, content, mode) of each installed file in site-packages of the distribution that owns
    `package_dir`, the .pth included; not the console scripts (outside it)."""
    distribution = _installed_distribution(package_dir)
    for file in distribution.files or ():
        relative = str(file)
        if relative.startswith("..") or "__pycache__" in relative:
            continue
        source = str(distribution.locate_file(file))
        info = os.stat(source)
        yield relative, files.read_bytes(source, _FILE_LIMIT, noted=False), stat.S_IMODE(info.st_mode) & 0o755


class Placed(NamedTuple):
    files: list[str]  # written, relative to the target
    tightened: str | None  # what was done to the target's mode, in words (trust.make_install_dir)
    target: str  # the directory written (a venv's site-packages for --venv)


Entry = tuple[str, bytes, int]  # (path relative to site-packages, content, mode)


def for_pythonpath(entries: Iterable[Entry]) -> list[Entry]:
    """What a directory on PYTHONPATH gets: site-packages' files less the .pth at its top (Python reads .pth
    files only from site-packages), plus sitecustomize.py, which arms the hook from there."""
    kept = [e for e in entries if not ("/" not in e[0] and e[0].endswith(".pth"))]
    return [*kept, ("sitecustomize.py", SITECUSTOMIZE.encode(), 0o644)]


def _write(places: list[tuple[str, str, bytes, int]]) -> None:
    """(directory, relative, data, mode) each: every place checked before the first file is written, so a
    refused install writes nothing."""
    for directory, relative, _, _ in places:
        door.check_install(directory, relative)
    for directory, relative, data, mode in places:
        door.install_file(directory, relative, data, mode)


def place(entries: Iterable[Entry], target: str) -> Placed:
    """Writes the entries and sitecustomize.py under `target` (door.install_file: nothing followed through a
    link planted there, every directory on the way only root's or this user's to change). Every place is
    checked before the first file is written: a refused install writes nothing (`target` itself may have
    been created or tightened, trust.make_install_dir). Raises OSError (files.Refused, trust.UntrustedPath)
    or InjectError."""
    tightened = trust.make_install_dir(target)
    written = for_pythonpath(entries)
    _write([(target, relative, data, mode | 0o444) for relative, data, mode in written])
    return Placed([relative for relative, _, _ in written], tightened, target)


def _dist_info(entries: list[Entry]) -> str:
    found = {r.split("/")[0] for r, _, _ in entries if "/" in r and r.split("/")[0].endswith(".dist-info")}
    if len(found) != 1:
        raise InjectError(
            f"the package's files hold {len(found)} dist-info directories {sorted(found)}, not one"
        )
    return found.pop()


def place_in_venv(entries: Iterable[Entry], venv_dir: str) -> Placed:
    """Writes the entries in the site-packages of the virtual environment `venv_dir` as pip would: the .pth
    (its python then arms the hook at start), the console scripts in its bin/ (run by its python), a RECORD
    of every file written (not what an installer wrote about its own install, in an installed copy).
    Refused, nothing written, where it holds another install of this package (another version, an editable
    one). Raises VenvError, InjectError or OSError (as place)."""
    from . import venv

    found = venv.find(venv_dir)
    entries = list(entries)
    dist_info = _dist_info(entries)
    if not any(e[0] == "vllm_tmaguard.pth" for e in entries):
        raise InjectError("the package's files have no vllm_tmaguard.pth, which arms the guard in a venv")
    others = venv.others_installed(door.listdir(found.site_packages), dist_info)
    if others:
        python = found.python
        raise InjectError(
            f"{found.site_packages} holds another install of {DISTRIBUTION} ({', '.join(others)}): "
            f"uninstall it (`{python} -m pip uninstall {DISTRIBUTION}`, or `uv pip uninstall --python "
            f"{python} {DISTRIBUTION}`), then inject"
        )
    entry_points = next((d for r, d, _ in entries if r == f"{dist_info}/entry_points.txt"), b"")
    scripts = [
        (name, venv.script(found.python, module, function), 0o755)
        for name, (module, function) in venv.console_scripts(entry_points.decode("utf-8", "replace")).items()
    ]
    record_path = f"{dist_info}/RECORD"
    left_out = {record_path, *(f"{dist_info}/{name}" for name in venv.INSTALLER_FILES)}
    entries = [e for e in entries if e[0] not in left_out]
    up = "../../../bin/"  # site-packages is lib/pythonX.Y/site-packages
    written = [(r, d) for r, d, _ in entries] + [(up + name, d) for name, d, _ in scripts]
    entries.append((record_path, venv.record(written, record_path), 0o644))
    tightened = [trust.make_install_dir(found.site_packages)]
    places = [(found.site_packages, r, d, m | 0o444) for r, d, m in entries]
    if scripts:
        tightened.append(trust.make_install_dir(found.bin))
        places += [(found.bin, name, d, m) for name, d, m in scripts]
    _write(places)
    said = "; ".join(t for t in tightened if t) or None
    placed = [r for r, _, _ in entries] + [up + name for name, _, _ in scripts]
    return Placed(placed, said, found.site_packages)


def inject(target: str, venv: bool = False) -> Placed:
    """Places the installed package in `target` (created if absent), or in the venv `target`."""
    entries = installed_entries(os.path.realpath(PACKAGE_DIR))
    return place_in_venv(entries, target) if venv else place(entries, target)


def inject_wheel(
    source: str, target: str, pins: tuple[str, ...] = (), venv: bool = False
) -> tuple[Placed, str]:
    """Places the package from the wheel in `source` (a wheel, or a directory of wheels: the one for this
    machine) in `target` (the venv `target` where `venv`), from the very bytes checked against `pins`
    (wheel.PIN_VARIABLE's digests, where given); returns what was placed and the wheel's path. Raises
    OSError, wheel.WheelError, InjectError or venv.VenvError."""
    from . import wheel

    found = wheel.for_this_machine(source)
    wheel.check_pinned(found, pins)
    placed = place_in_venv(found.entries, target) if venv else place(found.entries, target)
    return placed, found.path
