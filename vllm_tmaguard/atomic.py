"""The one way this package writes a file others read: a temporary file in the same directory, renamed
over the target, so a reader sees the old file or the whole new one, and a failed write leaves nothing."""

from __future__ import annotations

import contextlib
import os
import tempfile


def write_atomically(path: str, data: bytes, mode: int | None = None) -> None:
    """Writes `data` to `path` (optionally chmod `mode` before the rename). Raises OSError."""
    directory, name = os.path.split(path)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
