"""This package's wheel read from its bytes alone, as `tmaguard inject --wheel` places it (the zero-image
install: the stock vLLM image's Python, the wheel from a ConfigMap, no pip, no index, no network).

A wheel is a zip whose RECORD lists every member with its sha256; a member the RECORD does not vouch for,
or one whose bytes differ, refuses the whole wheel. The files are the ones pip would install in
site-packages (`*.data/purelib` and `*.data/platlib` at the top; scripts, headers and data left out), the
.pth included (inject.py leaves it out of a directory on PYTHONPATH). The WHEEL file's tag says which machine
its built libraries are for.

RECORD catches a damaged wheel, not a forged one (whose RECORD is forged with it). What catches that is a
pin kept where the wheel's ConfigMap cannot change it: TMAGUARD_WHEEL_SHA256, the sha256 of each wheel
allowed, on the init container (`tmaguard manifests --wheel` writes it): a wheel not pinned is refused."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import platform
import zipfile
from collections.abc import Iterator
from typing import NamedTuple

from .. import files
from ..stages import door

DISTRIBUTION_PREFIX = "vllm_tmaguard-"
WHEEL_LIMIT = 16 << 20  # the wheel is ~250 KB; a ConfigMap holds at most 1 MiB
MACHINES = ("x86_64", "aarch64", "ppc64le", "s390x")
_INSTALLED_DATA = ("purelib", "platlib")


PIN_VARIABLE = "TMAGUARD_WHEEL_SHA256"  # toggles.py parses it


class WheelError(ValueError):
    """A file that is not a wheel of this package, or one whose RECORD does not vouch for its bytes."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_pinned(wheel: Wheel, pins: tuple[str, ...]) -> None:
    """Raises WheelError where `pins` are given and the wheel's sha256 is not one of them."""
    digest = sha256(wheel.data)
    if pins and digest not in pins:
        raise WheelError(
            f"{wheel.path}: its sha256 {digest} is not one that {PIN_VARIABLE} pins ({', '.join(pins)}): "
            "the wheel ConfigMap was changed after the pin was written; apply the wheels the pin was made "
            "from, or pin these (`tmaguard wheel-configmap WHEEL` prints their digests)"
        )


class Wheel(NamedTuple):
    path: str
    version: str
    machine: str | None  # None: a pure wheel (no built libraries), any machine
    entries: list[tuple[str, bytes, int]]  # (path relative to site-packages, content, mode)
    data: bytes  # the wheel itself


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _machine(tags: list[str]) -> str | None:
    platforms = {tag.rsplit("-", 1)[-1] for tag in tags}
    if platforms <= {"any"}:
        return None
    machines = {m for p in platforms for m in MACHINES if p.endswith("_" + m)}
    if len(machines) != 1:
        raise WheelError(f"its tags {sorted(tags)} name no single machine")
    return machines.pop()


def _record(archive: zipfile.ZipFile, dist_info: str) -> dict[str, str]:
    text = archive.read(f"{dist_info}/RECORD").decode("utf-8")
    return {row[0]: row[1] for row in csv.reader(io.StringIO(text)) if row}


def _destination(name: str) -> str | None:
    """Where a member goes, relative to site-packages; None for what pip does not put there."""
    top, _, rest = name.partition("/")
    if top.endswith(".data"):
        kind, _, inner = rest.partition("/")
        return inner if kind in _INSTALLED_DATA and inner else None
    if "__pycache__" in name.split("/"):
        return None
    return name


def read(path: str) -> Wheel:
    """The wheel at `path` (links followed: a ConfigMap's keys are links), its RECORD checked. Raises
    OSError (files.Refused) or WheelError."""
    data = files.read_bytes(path, WHEEL_LIMIT, noted=False)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as error:
        raise WheelError(f"{path}: not a wheel ({error})") from None
    with archive:
        names = [i.filename for i in archive.infolist() if not i.is_dir()]
        dist_infos = {n.split("/")[0] for n in names if n.endswith(".dist-info/WHEEL") and n.count("/") == 1}
        if len(dist_infos) != 1 or not next(iter(dist_infos)).startswith(DISTRIBUTION_PREFIX):
            raise WheelError(f"{path}: not a wheel of vllm-tmaguard (dist-info: {sorted(dist_infos)})")
        dist_info = dist_infos.pop()
        version = dist_info.removeprefix(DISTRIBUTION_PREFIX).removesuffix(".dist-info")
        metadata = archive.read(f"{dist_info}/WHEEL").decode("utf-8")
        tags = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Tag:")]
        record = _record(archive, dist_info)
        unlisted = sorted(set(names) - set(record))
        missing = sorted(set(record) - set(names))
        if unlisted or missing:
            raise WheelError(
                f"{path}: RECORD does not match the archive: unlisted {unlisted}, missing {missing}"
            )
        entries = []
        for info in archive.infolist():
            if info.is_dir():
                continue
            content = archive.read(info)
            expected = record[info.filename]
            if info.filename != f"{dist_info}/RECORD" and expected != _digest(content):
                raise WheelError(f"{path}: {info.filename} does not match its RECORD hash")
            destination = _destination(info.filename)
            if destination is not None:
                mode = (info.external_attr >> 16) & 0o755 or 0o644
                entries.append((destination, content, mode))
    try:
        machine = _machine(tags)
    except WheelError as error:
        raise WheelError(f"{path}: {error}") from None
    return Wheel(path, version, machine, entries, data)


def this_machine() -> str:
    return platform.machine()


def candidates(source: str) -> Iterator[str]:
    """`source` itself when it is a file, else the *.whl files in the directory (a ConfigMap volume: its
    keys, not the ..data entries kubelet keeps beside them)."""
    if not door.is_directory(source):
        yield source
        return
    for name in sorted(door.listdir(source)):
        if name.endswith(".whl") and not name.startswith("."):
            yield f"{source.rstrip('/')}/{name}"


def for_this_machine(source: str, machine: str | None = None) -> Wheel:
    """The one wheel in `source` (a wheel, or a directory of wheels) built for this machine. Raises OSError
    or WheelError, naming what was found instead."""
    machine = machine or this_machine()
    found = [read(path) for path in candidates(source)]
    fitting = [w for w in found if w.machine in (machine, None)]
    if len(fitting) == 1:
        return fitting[0]
    seen = ", ".join(f"{w.path} ({w.machine or 'any machine'})" for w in found) or "no wheel"
    if not fitting:
        raise WheelError(f"no vllm-tmaguard wheel for {machine} in {source}: found {seen}")
    raise WheelError(f"more than one vllm-tmaguard wheel for {machine} in {source}: {seen}")
