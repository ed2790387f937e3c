"""The door's other room (files.py is the one every vLLM process passes): what only the full run, the doctor
and the installers do through it, under the same checks (docs/design.md §4.2): the full run's notes (every
file input it reads, with the observation taken as it was read: the verdict cache's inputs) and the probes'
noted reads of system files (links followed as the loader follows them); the private directory's writes
other than a record's (the verdict and scan caches, the overlay's subdirectory, the doctor's report);
installation writes (every directory on the way opened without following a link and checked installable,
the file written atomically); scratch directories. Kept apart so that a replay, which does none of it, does
not import it (docs/benchmarks.md: a later process's import)."""

from __future__ import annotations

import contextlib
import os
import stat as stat_module
from collections.abc import Iterator
from typing import Any

from ..files import (
    SYSTEM_FILE_LIMIT,
    PrivateDirectory,
    Refused,
    directory,
    kind_of,
    note,
    noted_by,
    observation,
    observe,
    open_regular,
    private,
    read_bytes,
    write_in,
)

# ---------------------------------------------------------------------------------------------------------
# The full run's notes: every file input it reads, as the door observes it (the verdict cache's inputs)


class Notes:
    """The file inputs read while noting (kind, path) -> observation, in the order first read. A path whose
    observation changes between two reads of one run makes the notes unsteady: a verdict decided from a file
    that changed under it is not kept."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], Any] = {}
        self.steady = True

    def add(self, kind: str, path: str, seen: Any) -> None:
        key = (kind, path)
        if key not in self.seen:
            self.seen[key] = seen
        elif self.seen[key] != seen:
            self.steady = False

    def renew(self, path: str) -> None:
        """The door itself changed `path` (the overlay's file): what a later process finds is the new file."""
        for kind, noted in list(self.seen):
            if noted == path:
                self.seen[(kind, noted)] = observe(kind, noted)

    def inputs(self) -> list[list[Any]]:
        return [[kind, path, seen] for (kind, path), seen in self.seen.items()]


@contextlib.contextmanager
def noting() -> Iterator[Notes]:
    """Notes every probe read until the block ends (files.note)."""
    notes = Notes()
    outer = noted_by(notes)
    try:
        yield notes
    finally:
        noted_by(outer)


@contextlib.contextmanager
def not_noting() -> Iterator[None]:
    """Reads whose result another input stands for (the vLLM scan, valid while its signature files are)."""
    outer = noted_by(None)
    try:
        yield
    finally:
        noted_by(outer)


# ---------------------------------------------------------------------------------------------------------
# What the probes read: system files, links followed as the loader follows them


def stat(path: str) -> os.stat_result | None:
    """os.stat, noted; None where it fails."""
    try:
        info = os.stat(path)
    except OSError as error:
        note("stat", path, ["error", error.errno])
        return None
    note("stat", path, observation("stat", info))
    return info


def is_directory(path: str) -> bool:
    """Whether `path` is a directory (links followed), noted by its stat."""
    info = stat(path)
    return info is not None and stat_module.S_ISDIR(info.st_mode)


def seen(path: str) -> list[Any]:
    """The "stat" observation of `path` (or its error), noted."""
    try:
        found = observation("stat", os.stat(path))
    except OSError as error:
        found = ["error", error.errno]
    note("stat", path, found)
    return found


def exists(path: str) -> bool:
    """Whether `path` exists (links followed), noted as such alone."""
    there = os.path.exists(path)
    note("exists", path, [there])
    return there


def listdir(path: str) -> list[str]:
    """The directory's entries, sorted, noted. Raises OSError."""
    try:
        names = sorted(os.listdir(path))
    except OSError as error:
        note("list", path, ["error", error.errno])
        raise
    note("list", path, names)
    return names


def glob(pattern: str) -> list[str]:
    """The paths matching `pattern` (fnmatch's wildcards in any component; as glob's, a name with a leading
    dot only where the component starts with one), sorted; every directory looked in is listed by listdir
    (noted). A directory that cannot be listed matches nothing."""
    from fnmatch import fnmatchcase  # the doctor's: not on every vLLM process's import path

    head, name = os.path.split(pattern)
    magic = any(c in name for c in "*?[")
    parents = glob(head) if head != pattern and any(c in head for c in "*?[") else [head]
    found = []
    for parent in parents:
        if not magic:
            if exists(os.path.join(parent, name)):
                found.append(os.path.join(parent, name))
            continue
        try:
            names = listdir(parent or os.curdir)
        except OSError:
            continue
        hidden = name.startswith(".")
        found += [os.path.join(parent, n) for n in names if fnmatchcase(n, name) and (hidden or n[0] != ".")]
    return sorted(found)


def _open_noted(path: str) -> tuple[int, os.stat_result]:
    """A regular file opened without blocking (links followed), noted by the stat of the very file opened
    (or its error). The caller closes it. Raises OSError."""
    try:
        fd = open_regular(path, None)
    except OSError as error:
        note("stat", path, ["error", error.errno])
        raise
    try:
        info = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    note("stat", path, observation("stat", info))
    return fd, info


def read_head(path: str, size: int) -> bytes:
    """The first `size` bytes of a regular file (links followed), noted by its stat. Raises OSError."""
    fd, _ = _open_noted(path)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def read_text(path: str, limit: int = SYSTEM_FILE_LIMIT) -> str | None:
    """read_bytes decoded (undecodable bytes replaced); None where it cannot be read."""
    try:
        return read_bytes(path, limit).decode("utf-8", "replace")
    except OSError:
        return None


@contextlib.contextmanager
def mapped(path: str) -> Iterator[tuple[Any, int]]:
    """A regular file mapped read-only, with its size, noted by its stat; an empty file maps as b"". Raises
    OSError."""
    import mmap

    fd, info = _open_noted(path)
    try:
        if info.st_size == 0:
            yield b"", 0
            return
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as image:
            yield image, info.st_size
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------------
# Writes: outputs, and where the operator installs the package or the overlay


def installed_problem(info: os.stat_result) -> str | None:
    """Why a directory that code is loaded from is not safe to write into (None: it is): a directory only
    root or this user can change."""
    euid, mode = os.geteuid(), stat_module.S_IMODE(info.st_mode)
    if not stat_module.S_ISDIR(info.st_mode):
        return f"is {kind_of(info.st_mode)}, not a directory"
    if info.st_uid not in (0, euid):
        return f"belongs to uid {info.st_uid}, neither root nor this user (uid {euid})"
    if mode & 0o022:
        return f"has mode {mode:04o}: others can replace what is written there; it must be 0755 or tighter"
    return None


def write_private(directory_path: str, name: str, data: bytes, mode: int = 0o600) -> str:
    """Writes `name` in the private directory atomically; its path. Raises OSError (files.Refused)."""
    with private(directory_path) as opened:
        return opened.write(name, data, mode)


def subdirectory(opened: PrivateDirectory, name: str) -> str:
    """`name` in the opened private directory, created 0700 if absent, checked private itself; its path."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=opened.fd)
    with directory(name, at=opened.fd):
        pass
    return os.path.join(opened.path, name)


def discard_into_null(fd: int) -> None:
    """Makes descriptor `fd` write into /dev/null (an output that failed: what is left is dropped). Raises
    OSError."""
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def make_private_dirs(path: str) -> None:
    """mkdir -p with mode 0700 for every directory it creates (os.makedirs gives parents 0777 & ~umask).
    Follows nothing it did not create: the checks come after (directory())."""
    missing = []
    current = path
    while not os.path.lexists(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for created in reversed(missing):
        with contextlib.suppress(FileExistsError):  # created concurrently: checked like any other
            os.mkdir(created, 0o700)


def _install_parts(directory_path: str, relative: str) -> list[str]:
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise Refused(os.path.join(directory_path, relative), "is not a path inside the directory")
    return parts


def _install_dirs(
    stack: contextlib.ExitStack, directory_path: str, parts: list[str], create: bool
) -> tuple[int | None, str]:
    """The directory the file of `parts` goes in, and its path: every directory on the way opened without
    following a link and checked installable, created 0755 where absent if `create`, else (None, its path)
    at the first one absent. Raises OSError (Refused, naming the directory)."""
    dir_fd = stack.enter_context(directory(directory_path, installed_problem))
    walked = directory_path
    for part in parts[:-1]:
        walked = os.path.join(walked, part)
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=dir_fd)
        try:
            dir_fd = stack.enter_context(directory(part, installed_problem, at=dir_fd))
        except FileNotFoundError:
            if create:
                raise
            return None, walked
        except Refused as refused:
            raise Refused(walked, refused.why) from None
    return dir_fd, walked


def check_install(directory_path: str, relative: str) -> None:
    """What install_file(directory_path, relative) would refuse, found before anything is written (a refused
    install writes nothing): every directory on the way that exists, opened without following a link and
    checked installable, and no directory in the file's place. Creates nothing. Raises OSError (Refused)."""
    parts = _install_parts(directory_path, relative)
    with contextlib.ExitStack() as stack:
        dir_fd, walked = _install_dirs(stack, directory_path, parts, create=False)
        if dir_fd is None:
            return  # the install creates it, and what is under it
        try:
            info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat_module.S_ISDIR(info.st_mode):
            raise Refused(os.path.join(walked, parts[-1]), "is a directory, where a file is to be written")


def install_file(directory_path: str, relative: str, data: bytes, mode: int) -> str:
    """Writes `relative` (a/b/file) under an installation directory (`tmaguard env`, `tmaguard inject`):
    every directory on the way opened without following a link and checked installable (created 0755 where
    absent), the file written atomically, so a link planted in its place is replaced, never followed. Returns
    its path. Raises OSError (Refused)."""
    parts = _install_parts(directory_path, relative)
    with contextlib.ExitStack() as stack:
        dir_fd, walked = _install_dirs(stack, directory_path, parts, create=True)
        assert dir_fd is not None  # created
        write_in(dir_fd, parts[-1], data, mode, walked)
    return os.path.join(directory_path, *parts)


def make_install_dirs(path: str) -> None:
    """mkdir -p with mode 0755 (an installation directory: tighten and the trust check come after)."""
    os.makedirs(path, mode=0o755, exist_ok=True)


@contextlib.contextmanager
def scratch_directory(prefix: str) -> Iterator[str]:
    """A new private directory (tempfile.mkdtemp: 0700, a random name), removed with what is in it after."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def tighten(directory_path: str) -> str | None:
    """Makes an installation directory this user owns 0755 when group or others could write to it (kubelet
    makes emptyDir volumes 0777); what was done, in words, or None. Raises OSError."""
    fd = os.open(directory_path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        mode = stat_module.S_IMODE(info.st_mode)
        if info.st_uid != os.geteuid() or not mode & 0o022:
            return None
        os.fchmod(fd, mode & ~0o022)
        tightened = mode & ~0o022
        return f"{directory_path} was mode {mode:04o}: made {tightened:04o} (only its owner may change it)"
    finally:
        os.close(fd)
