"""The overlay: a library with SONAME libcuda.so.1 that depends on the layer's own file and adds only the
entry points the layer lacks. Loaded before anything else loads libcuda.so.1, it becomes the process's
libcuda.so.1 (docs/design.md §2.6), so handle-scoped look-ups (cudart's cuGetProcAddress_v2, Triton's
cuLaunchKernelEx) find the layer's hooked functions and the added ones."""

from __future__ import annotations

import contextlib
import hashlib
import os

from .. import files
from . import door, trust
from .catalogue import overlay_path
from .elf import ElfError, retag_dynamic

# Same constant as setup.py: the placeholder (in .dynstr and in .rodata) the layer's path replaces.
PLACEHOLDER = b"/tmaguard-layer-placeholder/" + b"x" * 220
# The package's variants name the placeholder in a DT_AUXILIARY entry (an optional filter the loader may
# skip, so that the file as shipped needs no library outside the manylinux policy); the overlay written
# for a layer turns it into DT_NEEDED on the layer's file.
DT_NEEDED, DT_AUXILIARY = 1, 0x7FFFFFFD
_OVERLAY_LIMIT = 64 << 20


class OverlayError(RuntimeError):
    pass


def overlay_image(layer_path: str) -> bytes:
    """The package's overlay, its placeholder replaced by the layer's absolute path."""
    if not os.path.isabs(layer_path):
        raise OverlayError(f"layer path {layer_path!r} is not absolute")
    encoded = os.fsencode(layer_path)
    if len(encoded) > len(PLACEHOLDER) or b"\0" in encoded:
        raise OverlayError(f"layer path {layer_path!r} is longer than {len(PLACEHOLDER)} bytes")
    path = overlay_path()
    image = bytearray(files.read_bytes(path, _OVERLAY_LIMIT))
    if image.count(PLACEHOLDER + b"\0") != 2:  # in .dynstr and the copy in .rodata
        raise OverlayError(f"{path} does not carry the layer placeholder twice")
    try:
        slots = retag_dynamic(path, image, DT_AUXILIARY, DT_NEEDED)
    except ElfError as error:
        raise OverlayError(str(error)) from None
    if slots != 1:
        raise OverlayError(f"{path} has {slots} DT_AUXILIARY entries for the layer, not one")
    return bytes(image.replace(PLACEHOLDER + b"\0", encoded.ljust(len(PLACEHOLDER) + 1, b"\0")))


def write_private(image: bytes, directory: str) -> str:
    """Writes the image as <directory>/overlay-<hash>/libcuda.so.1 (content-addressed, so that a pod's
    processes share one file; mode 0500), unless that file already holds exactly the image. Returns its
    real path, checked (trust.py); raises OSError (UntrustedPath, files.Refused included) otherwise."""
    with files.private(directory) as opened:
        target_dir = door.subdirectory(opened, f"overlay-{hashlib.sha256(image).hexdigest()[:16]}")
    problem = files.path_problem(target_dir, private=True)
    if problem is not None:
        raise trust.UntrustedPath(target_dir, problem)
    if not _holds(target_dir, image):
        door.write_private(target_dir, "libcuda.so.1", image, 0o500)
    return trust.trusted_file(os.path.join(target_dir, "libcuda.so.1"))


def _holds(directory: str, image: bytes) -> bool:
    try:
        return files.read_private(directory, "libcuda.so.1", len(image)) == image
    except OSError:
        return False


_memfds: list[int] = []  # kept open for the process's lifetime: the loader maps the file through it


def write_memfd(image: bytes) -> str:
    """For a read-only file system: an anonymous in-memory file, opened through /proc/self/fd."""
    fd = os.memfd_create("libcuda.so.1", 0)
    os.write(fd, image)
    _memfds.append(fd)
    return f"/proc/self/fd/{fd}"


def install(layer_path: str, directory: str | None) -> str:
    """The overlay's file for this layer, in `directory` (the guard's, from trust.private_dir; write_private
    checks again what it creates there), else in memory (also when `directory` is None). Raises
    UntrustedPath when the package's own variant is not trusted."""
    trust.trusted_file(overlay_path())
    image = overlay_image(layer_path)
    if directory is not None:
        with contextlib.suppress(OSError):
            return write_private(image, directory)
    return write_memfd(image)
