"""The one door to every file the package touches (docs/design.md §4.2; stages/door.py is its other room).
lists, creates or renames a file; what it checks, it checks here, once:

  - never blocks: every open has O_NONBLOCK and is followed by a type check (a FIFO or a device is refused);
  - never reads without a bound: every read has a size cap (Refused past it);
  - the private directory (the guard's records and caches): opened without following a link, its owner
    (this user) and mode (0700) checked on the open descriptor, every file in it reached from that
    descriptor without following a link, owned by this user and writable by nobody else;
  - writes are atomic: a temporary file named with the pid and randomness (two processes of one pid in two
    PID namespaces share a directory), created exclusively, renamed over the target; temporary files a
    killed process left behind are removed by later writers;
  - what the probes read is noted, with the observation taken as they read it (the verdict cache's inputs
    are what was read, not worked out a second time: verdict.py).

Standard library only: every vLLM process comes through here. What only the full run, the doctor and the
installers do (the probes' other noted reads, installation writes, scratch directories) is the door's other
room, stages/door.py, under these same checks: a replay does not import it. Long because it is the one place
every check a replay makes on a file lives, for reading and for writing."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import stat as stat_module
import time
from collections.abc import Callable, Iterator
from typing import Any

PRIVATE_JSON_LIMIT = 8 << 20  # a record is ~10 KB, the verdict cache ~100 KB
SYSTEM_FILE_LIMIT = 64 << 20  # ld.so.cache, vLLM's RECORD, /proc files, sources
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


class Refused(OSError):
    """A file or directory the door will not use, with why in words an operator acts on."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EPERM, why, path)
        self.path, self.why = path, why

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def kind_of(mode: int) -> str:
    """A file type in words ("a FIFO", "a directory"...)."""
    for test, name in (
        (stat_module.S_ISDIR, "a directory"), (stat_module.S_ISFIFO, "a FIFO"),
        (stat_module.S_ISLNK, "a symbolic link"), (stat_module.S_ISSOCK, "a socket"),
        (stat_module.S_ISCHR, "a character device"), (stat_module.S_ISBLK, "a block device"),
    ):  # fmt: skip
        if test(mode):
            return name
    return "a regular file" if stat_module.S_ISREG(mode) else "not a regular file"


# ---------------------------------------------------------------------------------------------------------
# Observations: what a file input looks like now, as the verdict cache compares it


def observation(kind: str, info: os.stat_result) -> list[Any]:
    """A stat as JSON. ("stat") identity, size, modification and change times, owner: the change time moves
    with every content or metadata change and cannot be set back (`touch -r` sets the modification time
    only); ("owner") what a trust check reads of a component: type, mode, identity, owner."""
    if kind == "owner":
        return [info.st_mode, info.st_ino, info.st_dev, info.st_uid, info.st_gid]
    return [
        info.st_mode, info.st_ino, info.st_dev, info.st_size, info.st_mtime_ns, info.st_ctime_ns,
        info.st_uid, info.st_gid,
    ]  # fmt: skip


def observe(kind: str, path: str) -> Any:
    """One file input as it is now: ("stat") links followed, ("owner") not; ("exists") whether it does;
    ("list") a directory's sorted entries; ("read") a /proc file's content; or the error number."""
    try:
        if kind == "exists":
            return [os.path.exists(path)]
        if kind == "list":
            return sorted(os.listdir(path))
        if kind == "read":
            return read_bytes(path, SYSTEM_FILE_LIMIT, noted=False).decode("utf-8", "replace")
        return observation(kind, os.lstat(path) if kind == "owner" else os.stat(path))
    except OSError as error:
        return ["error", error.errno]


# The full run's notes (stages/door.py's Notes) while it notes its reads; None otherwise.
_notes: Any = None


def noted_by(notes: Any) -> Any:
    """Makes `notes` (stages/door.py's Notes, or None) receive the door's notes; returns the ones before."""
    global _notes
    outer, _notes = _notes, notes
    return outer


def renew(path: str) -> None:
    """A write of the door's changed `path`: what a later process finds is the new file."""
    if _notes is not None:
        _notes.renew(path)


def note(kind: str, path: str, seen: Any) -> None:
    """Notes a read of `path` (while noting): the door's, and its other room's (stages/door.py)."""
    if _notes is not None:
        _notes.add(kind, path, seen)


# ---------------------------------------------------------------------------------------------------------
# Reading: what every process reads (a /proc file, vLLM's --config file, its private directory), and the
# components a trust check walks. The probes' other reads are in stages/door.py.


def lstat(path: str) -> os.stat_result:
    """os.lstat, noted (a trust check's component). Raises OSError."""
    try:
        info = os.lstat(path)
    except OSError as error:
        note("owner", path, ["error", error.errno])
        raise
    note("owner", path, observation("owner", info))
    return info


def realpath(path: str) -> str:
    """os.path.realpath, with every component it walks noted (as written and as resolved)."""
    real = os.path.realpath(path)
    if _notes is None:
        return real
    for start in (os.path.abspath(path), real):
        for component in components(start):
            with contextlib.suppress(OSError):
                lstat(component)
    return real


def components(path: str) -> list[str]:
    """'/a/b/c' -> ['/', '/a', '/a/b', '/a/b/c']."""
    parts, current = ["/"], "/"
    for name in path.strip("/").split("/"):
        if name:
            current = os.path.join(current, name)
            parts.append(current)
    return parts


def open_regular(path: str, limit: int | None, *, dir_fd: int | None = None, follow: bool = True) -> int:
    """A descriptor of a regular file (a /proc file counts) opened without blocking, or OSError (Refused for
    another type, or a file larger than `limit`)."""
    fd = os.open(path, _FLAGS | (0 if follow else os.O_NOFOLLOW), dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat_module.S_ISREG(info.st_mode):
            raise Refused(path, f"is {kind_of(info.st_mode)}, not a regular file")
        if limit is not None and info.st_size > limit:
            raise Refused(path, f"is {info.st_size} bytes, more than the {limit} this file may have")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_all(fd: int, path: str, limit: int) -> bytes:
    chunks, size = [], 0
    while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise Refused(path, f"holds more than the {limit} bytes this file may have")
    return b"".join(chunks)


def _proc(path: str) -> bool:
    return path.startswith("/proc/") or "/proc/driver/" in path


def read_bytes(path: str, limit: int = SYSTEM_FILE_LIMIT, *, noted: bool = True) -> bytes:
    """A system file's content (links followed). Noted by its content for a /proc file (its stat says
    nothing), else by the stat of the very file read. Raises OSError (Refused: not a regular file, too
    large)."""
    try:
        fd = open_regular(path, limit)
    except OSError as error:
        if noted:
            note("read" if _proc(path) else "stat", path, ["error", error.errno])
        raise
    try:
        info = os.fstat(fd)
        data = _read_all(fd, path, limit)
    finally:
        os.close(fd)
    if noted:
        kind = "read" if _proc(path) else "stat"
        note(kind, path, data.decode("utf-8", "replace") if kind == "read" else observation("stat", info))
    return data


def read_shared_file(path: str, limit: int) -> bytes:
    """A file that vLLM reads after the guard (the `--config` YAML a command line names), links followed as
    vLLM follows them: opened only where its stat says it is a regular file, since opening a FIFO alone
    releases its writer to vLLM's loss; then read as read_bytes reads (without blocking, `limit` bytes at
    most). Not noted: what the caller makes of it is its verdict input. Raises OSError (Refused)."""
    info = os.stat(path)
    if not stat_module.S_ISREG(info.st_mode):
        raise Refused(path, f"is {kind_of(info.st_mode)}, not a regular file")
    return read_bytes(path, limit, noted=False)


# ---------------------------------------------------------------------------------------------------------
# Directories the package writes to: its private directory (installation directories: stages/door.py)


def private_problem(info: os.stat_result) -> str | None:
    """Why a directory's own stat is not this user's alone (None: it is)."""
    euid, mode = os.geteuid(), stat_module.S_IMODE(info.st_mode)
    if not stat_module.S_ISDIR(info.st_mode):
        return f"is {kind_of(info.st_mode)}, not a directory"
    if info.st_uid != euid:
        return f"belongs to uid {info.st_uid}, not to this user (uid {euid})"
    if mode & 0o077:
        who = "everyone" if mode & 0o007 else "its group"
        return f"has mode {mode:04o}: {who} can enter it; it must be 0700 (this user's alone)"
    return None


@contextlib.contextmanager
def directory(
    path: str, judge: Callable[[os.stat_result], str | None] = private_problem, *, at: int | None = None
) -> Iterator[int]:
    """A descriptor of directory `path`, opened without following a link (relative to descriptor `at` when
    given), whose own stat `judge` finds no problem with: private (this user's alone) unless another judge is
    given (stages/door.py's installation directories). Raises OSError (Refused when it is not)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused(path, "is a symbolic link or not a directory") from None
        raise
    try:
        info = os.fstat(fd)
        problem = judge(info)
        if problem:
            raise Refused(path, problem)
        yield fd
    finally:
        os.close(fd)


def read_private(directory_path: str, name: str, limit: int = PRIVATE_JSON_LIMIT) -> bytes:
    """A file of the private directory: not a link, a regular file, this user's, writable by nobody else, at
    most `limit` bytes. Raises OSError (Refused when any of that is not so)."""
    with directory(directory_path) as dir_fd:
        path = os.path.join(directory_path, name)
        try:
            fd = open_regular(name, limit, dir_fd=dir_fd, follow=False)
        except Refused as refused:  # named by its path, not by its name in the directory
            raise Refused(path, refused.why) from None
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise Refused(path, "is a symbolic link") from None
            raise
        try:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid() or info.st_mode & 0o022:
                raise Refused(
                    path, f"belongs to uid {info.st_uid} with mode {stat_module.S_IMODE(info.st_mode):04o}: "
                    f"not this user's alone (uid {os.geteuid()}, writable by nobody else)",
                )  # fmt: skip
            return _read_all(fd, path, limit)
        finally:
            os.close(fd)


class NotJson(ValueError):
    pass


def parse_json(data: bytes, path: str) -> Any:
    """JSON, or NotJson naming the file (too deep a nesting included)."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as error:
        raise NotJson(f"{path}: not JSON ({type(error).__name__}: {str(error)[:120]})") from None


def read_private_json(directory_path: str, name: str, limit: int = PRIVATE_JSON_LIMIT) -> Any:
    """read_private, parsed. Raises OSError or NotJson."""
    return parse_json(read_private(directory_path, name, limit), os.path.join(directory_path, name))


def default_record_dir() -> str:
    """TMAGUARD_RECORD_DIR's default."""
    return f"/tmp/tmaguard-{os.getuid()}"


# ---------------------------------------------------------------------------------------------------------
# Path trust (docs/SECURITY.md; stages/trust.py applies it): a library the guard loads may be as writable as
# the package code that loads it, never more. Whoever can change a path is the owner of each of its
# components, and the group and others where a component is writable by them (a directory with the sticky bit,
# like /tmp, may be world-writable: nobody else can rename or replace its entries there). Here, beside the
# door's other checks: a replay that loads a library asks it again in every vLLM process.


def _changers(info: os.stat_result, last: bool) -> dict[str, str]:
    """Who besides root can change a path through this component: {principal: how}."""
    mode = info.st_mode
    owner = info.st_uid
    changers = {} if owner == 0 else {f"uid {owner}": f"owned by uid {owner} (neither root nor this user)"}
    if stat_module.S_ISLNK(mode) or (stat_module.S_ISDIR(mode) and mode & stat_module.S_ISVTX and not last):
        return changers  # a link's mode means nothing; a sticky directory's entries are their owners' alone
    octal = f"mode {stat_module.S_IMODE(mode):04o}"
    if mode & 0o020:
        changers[f"gid {info.st_gid}"] = f"writable by group {info.st_gid} ({octal})"
    if mode & 0o002:
        changers["others"] = f"writable by others ({octal})"
    return changers


def _walk(path: str, private: bool, _links: int = 0) -> list[tuple[str, os.stat_result, bool, bool]] | str:
    """(component, its lstat, whether it is the last of its path, whether it must be private) for every
    component as written and, through each symbolic link, as resolved (a link counts as its owner's: in
    /tmp anyone can plant one); or why a component cannot be read."""
    if _links > 40:
        return f"{path}: too many levels of symbolic links"
    written = os.path.abspath(path)
    steps: list[tuple[str, os.stat_result, bool, bool]] = []
    for component in components(written):
        try:
            info = lstat(component)
        except OSError as error:
            return f"{component}: {error.strerror or error}"
        last = component == written
        steps.append((component, info, last, last and private))
        if stat_module.S_ISLNK(info.st_mode):
            target = _walk(realpath(component), private and last, _links + 1)
            if isinstance(target, str):
                return f"{component} -> {target}"
            steps += target
    return steps


@functools.cache
def package_changers() -> frozenset[str]:
    """Who besides root can change this package's own code (the principals of _changers)."""
    steps = _walk(os.path.abspath(__file__), private=False)  # this file is the package's code too
    if isinstance(steps, str):
        return frozenset()
    return frozenset(p for _, info, last, _ in steps for p in _changers(info, last))


def path_problem(path: str, private: bool = False) -> str | None:
    """Why `path` is not trusted (None: it is): someone other than root and this user can change it who
    cannot change this package's code. `private`: nobody but this user may change it, and the last
    component must be owned by this user and closed to group and others (mode 0700)."""
    euid = os.geteuid()
    own = f"uid {euid}"
    steps = _walk(path, private)
    if isinstance(steps, str):
        return steps
    for component, info, last, must_be_private in steps:
        for principal, how in _changers(info, last).items():
            # Who can change the package's own code is asked only of a path someone else can change (its
            # walk is a dozen calls, in every replay that loads a library otherwise).
            if principal != own and (private or principal not in package_changers()):
                unlike = "not private to this user" if private else "which this package's own code is not"
                return f"{component} is {how}, {unlike}"
        if must_be_private and (info.st_uid != euid or info.st_mode & 0o077):
            return (
                f"{component} is not private to this user (owner uid {info.st_uid}, mode "
                f"{stat_module.S_IMODE(info.st_mode):04o}; needs uid {euid}, mode 0700)"
            )
    return None


# ---------------------------------------------------------------------------------------------------------
# Writes: the private directory (installation writes: stages/door.py)

TEMPORARY_SUFFIX = ".tmp"
STALE_TEMPORARY_S = 60  # a temporary file older than this belongs to a process that died writing it
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def append_line(path: str, line: str) -> None:
    """Appends one line to an existing regular file (the kubelet's termination-message file), never through
    a link, never creating it, never blocking. Raises OSError."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat_module.S_ISREG(info.st_mode):
            raise Refused(path, f"is {kind_of(info.st_mode)}, not a regular file")
        os.write(fd, line.encode("utf-8", "backslashreplace") + b"\n")
    finally:
        os.close(fd)


def temporary_name(name: str) -> str:
    """Unique across processes, PID namespaces too: the pid and 64 random bits."""
    return f".{name}.{os.getpid()}-{os.urandom(8).hex()}{TEMPORARY_SUFFIX}"


def write_in(dir_fd: int, name: str, data: bytes, mode: int, path: str) -> None:
    """`name` written atomically in the directory `dir_fd` (whose path is `path`)."""
    temporary = temporary_name(name)
    fd = os.open(temporary, _NEW, 0o600, dir_fd=dir_fd)
    try:
        try:
            view, done = memoryview(data), 0
            while done < len(data):
                done += os.write(fd, view[done:])
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise
    renew(os.path.join(path, name))


def beyond_newest(mtimes: dict[str, int], keep: int) -> list[str]:
    """The names beyond the newest `keep` by modification time (ties: by name, so that every process
    pruning at once agrees). Only names that exist: one removed by another process since the listing must
    not take a place among the newest (a real record would be removed in its stead)."""
    return sorted(mtimes, key=lambda name: (mtimes[name], name), reverse=True)[keep:]


class PrivateDirectory:
    """The guard's private directory, opened and checked once (files.directory), written through its
    descriptor."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path = fd, path

    def write(self, name: str, data: bytes, mode: int = 0o600) -> str:
        """Writes `name` atomically; its path."""
        write_in(self.fd, name, data, mode, self.path)
        return os.path.join(self.path, name)

    def link(self, source: str, name: str) -> None:
        """Makes `name` the same file as `source` (a hard link renamed over it: readers see the old or the
        new); where the file system has no hard links, a copy."""
        temporary = temporary_name(name)
        try:
            os.link(source, temporary, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
            os.replace(temporary, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=self.fd)
            self.write(name, read_private(self.path, source))
            return
        # rename() of a file onto another link of the same file does nothing and leaves the temporary name:
        # `name` already was `source` (another process of the same pid, in another PID namespace, linked it).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=self.fd)

    def prune(self, prefix: str, suffix: str, keep: int, slack: int = 0) -> None:
        """Keeps the newest `keep` files named prefix*suffix once more than keep + `slack` are there (each
        file's age is a stat call: with slack, one writer in `slack` pays for them, not every writer), and
        removes the stale temporary files, here and in the subdirectories (the overlay's: sweep). Never
        raises."""
        with contextlib.suppress(OSError):
            with os.scandir(self.fd) as listed:
                entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listed]
            names = [name for name, _ in entries]
            kept = [n for n in names if n.startswith(prefix) and n.endswith(suffix)]
            removed = self._stale(names)
            if len(kept) > keep + slack:
                removed += beyond_newest(self._mtimes(kept), keep)
            self._remove(removed)
            for name in (name for name, is_directory in entries if is_directory):
                with contextlib.suppress(OSError), directory(name, at=self.fd) as fd:
                    PrivateDirectory(fd, os.path.join(self.path, name)).sweep()

    def sweep(self) -> None:
        """Removes temporary files older than STALE_TEMPORARY_S: a process killed between create and rename
        left them (a younger one may be another process's write under way). Never raises."""
        with contextlib.suppress(OSError):
            self._remove(self._stale(os.listdir(self.fd)))

    def _stale(self, names: list[str]) -> list[str]:
        horizon = time.time_ns() - STALE_TEMPORARY_S * 1_000_000_000
        temporary = [n for n in names if n.startswith(".") and n.endswith(TEMPORARY_SUFFIX)]
        return [n for n, mtime in self._mtimes(temporary).items() if mtime < horizon]

    def _remove(self, names: list[str]) -> None:
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.fd)

    def _mtimes(self, names: list[str]) -> dict[str, int]:
        """Each name's modification time (ns), of the names still there: another process may have removed
        one since the listing."""
        mtimes = {}
        for name in names:
            with contextlib.suppress(OSError):
                mtimes[name] = os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mtime_ns
        return mtimes


@contextlib.contextmanager
def private(directory_path: str) -> Iterator[PrivateDirectory]:
    """The private directory `directory_path`, opened without following a link and checked this user's
    alone. Raises OSError (files.Refused)."""
    with directory(directory_path) as fd:
        yield PrivateDirectory(fd, directory_path)
