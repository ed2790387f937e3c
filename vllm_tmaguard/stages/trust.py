"""What the guard trusts (docs/SECURITY.md): the files it loads code from and the directory it writes its
runtime files to (what may appear in what it prints: redaction.py).

Path trust (the rule is the door's, files.path_problem, which every replay asks again): a library the guard
loads may be as writable as the package code that loads it, never more. Whoever can change a path is the owner
of each of its components, and the group and others where a component is writable by them (a directory with
the sticky bit, like /tmp, may be world-writable: nobody else can rename or replace its entries there). A
library is loaded only when everyone who can change it, other than root and this process's effective user, can
also change this package's own code. A root-owned install with no group or world write (the usual image)
therefore trusts only root-owned, write-protected libraries; an OpenShift-style image (`chmod -R g=u`, run as
an arbitrary user in group 0) trusts libraries writable by group 0 as its code is, and nothing writable by
others. The guard's runtime directory must in addition be this user's and private (0700). The real path is
returned and loaded, so a symbolic link cannot be swapped between the check and the load."""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

from .. import files
from ..codes import FOUND_ON_THE_SYSTEM
from ..files import path_problem
from . import door
from .door import make_install_dirs, make_private_dirs, tighten

if TYPE_CHECKING:
    from .outcomes import Problem


class UntrustedPath(OSError):
    """A path the guard refuses to load code from or write its runtime files to (an OSError, so callers'
    load-failure handling covers it)."""

    def __init__(self, path: str, why: str) -> None:
        self.path, self.why = path, why
        super().__init__(f"refused: {why}")


def trusted_file(path: str) -> str:
    """The real path of `path` if code may be loaded from it; raises UntrustedPath otherwise (and
    FileNotFoundError when there is no such file)."""
    if door.stat(path) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    problem = path_problem(path)
    if problem is not None:
        raise UntrustedPath(path, problem)
    return files.realpath(path)


def private_dir(path: str) -> tuple[str | None, str | None]:
    """(real path, None) of a directory that is this user's alone, created 0700 (missing parents too) if
    absent; (None, why) when it cannot be created or is not private. An existing directory with another
    owner or a wider mode is refused, not repaired: someone else may already have put files in it."""
    if not os.path.isabs(path):
        return None, f"{path!r} is not an absolute path"
    try:
        make_private_dirs(path)
    except OSError as error:
        return None, f"cannot create {path}: {error.strerror or error}"
    problem = why_not_private(path)
    return (None, problem) if problem else (files.realpath(path), None)


def why_not_private(path: str) -> str | None:
    """Why an existing directory is not this user's alone (or a path to it is weak); None if it is. Creates
    nothing."""
    return _not_private(path) or path_problem(path, private=True)


def _not_private(path: str) -> str | None:
    """Why the directory itself is not this user's alone, in the words an operator acts on."""
    try:  # the directory's own stat, in an operator's words; the walk after it notes what it reads
        info = os.stat(path)
    except OSError as error:
        return f"{path}: {error.strerror or error}"
    problem = files.private_problem(info)
    return f"{path} {problem}" if problem else None


def writable_layer(path: str | None, how: str, root: str) -> Problem | None:
    """The libcuda.so.1 this process's loader picks (`how`: how it found it), where someone besides root and
    this user can change it who cannot change this package's code: a co-tenant-writable directory on
    LD_LIBRARY_PATH, say. The loader loads it into every process whether or not the guard runs, so the
    guard's overlay, which loads the same file, is no worse; the guard and `tmaguard env` both say so,
    with this problem. None where it is trusted, or found only under TMAGUARD_ROOT (nothing is loaded for
    that one: probe_root_problem)."""
    if path is None or probe_root_problem(root, how, path) is not None:
        return None
    problem = path_problem(path)
    if problem is None:
        return None
    from ..codes import LAYER_WRITABLE
    from .outcomes import Problem

    return Problem(
        LAYER_WRITABLE,
        cause=f"libcuda.so.1 ({path}) is loaded from where others can change it: {problem}",
        consequence="whoever can change it can change the code every process of this container loads, with "
        "or without the guard (the loader finds it; the guard's overlay loads the same file)",
        fix=f"make {os.path.dirname(path)} and {path} root's (or this user's) and not writable by group or "
        "others, or take that directory off LD_LIBRARY_PATH",
        subject=path,
    )


def make_install_dir(path: str) -> str | None:
    """A directory code will be loaded from (`tmaguard env --install-dir`, `tmaguard inject`): created 0755
    if absent, made 0755 where it is this user's and group- or world-writable (kubelet makes emptyDir
    volumes 0777), then judged like a library's path. Returns what was tightened, in words; raises OSError
    (UntrustedPath where someone else could still replace what is written there)."""
    make_install_dirs(path)
    tightened = tighten(path)
    problem = path_problem(path)
    if problem is not None:
        raise UntrustedPath(path, problem)
    return tightened


def probe_root_problem(root: str, how: str, path: str | None) -> str | None:
    """Why nothing may be loaded for a libcuda.so.1 found through TMAGUARD_ROOT (None: it was not).
    TMAGUARD_ROOT points the file probes at another tree (tests, a pod's files seen from outside); what
    this process's own loader finds is never under it, so a toggle cannot make the guard load a file."""
    if root in ("", "/") or how not in FOUND_ON_THE_SYSTEM:
        return None
    return (
        f"libcuda.so.1 ({path}) was found under TMAGUARD_ROOT={root} ({how}), not where this process's "
        "loader looks: the guard loads nothing for it"
    )
