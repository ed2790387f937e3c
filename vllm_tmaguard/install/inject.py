"""The no-rebuild install (docs/operator.md): this package copied into a directory that the stock vLLM image
gets on PYTHONPATH, with a sitecustomize.py that arms the import hook at interpreter start. A pip install's
vllm_tmaguard.pth does that from site-packages; Python reads .pth files only there, not from PYTHONPATH.
The platform-plugin entry point is found through the copied dist-info (importlib.metadata reads sys.path).

  1. copy the installed distribution's files (no .pth, no console script) into the directory, through the
     door's install writes (nothing followed through a link planted in the directory);
  2. write sitecustomize.py: arm the hook, then run the sitecustomize.py it shadows, if the image has one.

The same files come from the wheel's bytes alone (`inject --wheel`, wheel.py) where the package is not
installed: the zero-image init container runs this module from the wheel itself (zipimport) in the stock
vLLM image's Python, and places what a pip install of that wheel would have put in site-packages."""

import os
import stat
from collections.abc import Iterable, Iterator
from importlib import metadata
from typing import NamedTuple

from .. import files, trust

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
    """(relative path, content, mode) of each installed file of the distribution that owns `package_dir`,
    but the .pth (Python reads .pth files only from site-packages) and the console scripts (outside it)."""
    distribution = _installed_distribution(package_dir)
    for file in distribution.files or ():
        relative = str(file)
        if relative.startswith("..") or relative.endswith(".pth") or "__pycache__" in relative:
            continue
        source = str(distribution.locate_file(file))
        info = os.stat(source)
        yield relative, files.read_bytes(source, _FILE_LIMIT, noted=False), stat.S_IMODE(info.st_mode) & 0o755


class Placed(NamedTuple):
    files: list[str]  # written, relative to the target
    tightened: str | None  # what was done to the target's mode, in words (trust.make_install_dir)


def place(entries: Iterable[tuple[str, bytes, int]], target: str) -> Placed:
    """Writes the entries and sitecustomize.py under `target` (files.install_file: nothing followed through a
    link planted there, every directory on the way only root's or this user's to change). Every place is
    checked before the first file is written: a refused install writes nothing (`target` itself may have
    been created or tightened, trust.make_install_dir). Raises OSError (files.Refused, trust.UntrustedPath)
    or InjectError."""
    tightened = trust.make_install_dir(target)
    written = [*entries, ("sitecustomize.py", SITECUSTOMIZE.encode(), 0o644)]
    for relative, _, _ in written:
        files.check_install(target, relative)
    for relative, data, mode in written:
        files.install_file(target, relative, data, mode | 0o444)
    return Placed([relative for relative, _, _ in written], tightened)


def inject(target: str) -> Placed:
    """Places the installed package in `target` (created if absent)."""
    return place(installed_entries(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))), target)


def inject_wheel(source: str, target: str, pins: tuple[str, ...] = ()) -> tuple[Placed, str]:
    """Places the package from the wheel in `source` (a wheel, or a directory of wheels: the one for this
    machine) in `target`, from the very bytes checked against `pins` (wheel.PIN_VARIABLE's digests, where
    given); returns what was placed and the wheel's path. Raises OSError or wheel.WheelError."""
    from . import wheel

    found = wheel.for_this_machine(source)
    wheel.check_pinned(found, pins)
    return place(found.entries, target), found.path
