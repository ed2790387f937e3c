"""Zeroes the device-code payloads a compute-capability-9.0 GPU never loads, so that an extension module
compresses small enough to carry to the Hopper machine. Entry headers stay in place: the driver still sees
every fat binary and picks the sm_90 / sm_90a cubin (or, for a fat binary without one, its PTX) as before.

usage: trim_fatbin.py IN OUT   (prints bytes zeroed per architecture)"""

from __future__ import annotations

import struct
import sys
from collections import Counter

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from vllm_tmaguard.doctor.fatbin import (
    _CONTAINER,
    _ENTRY,
    FLAG_ARCH_SPECIFIC,
    FLAG_FAMILY_SPECIFIC,
    MAGIC,
    Entry,
)
from vllm_tmaguard.stages.elf import section_extent

HOPPER = (9, 0)


def entries(image: bytearray, start: int, end: int):
    """(container start, [(payload offset, payload size, Entry)]) per fat binary in image[start:end]."""
    position = start
    while position + _CONTAINER.size <= end:
        magic, _, header_size, size = _CONTAINER.unpack_from(image, position)
        if magic != MAGIC:
            position += 8
            continue
        found, at, stop = [], position + header_size, position + header_size + size
        while at < stop:
            kind, _, entry_header, payload = _ENTRY.unpack_from(image, at)
            (arch,) = struct.unpack_from("<I", image, at + 28)
            (flags,) = struct.unpack_from("<Q", image, at + 40)
            variant = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY_SPECIFIC else ""
            entry = Entry("sass" if kind == 2 else "ptx", arch, variant, 0)
            found.append((at + entry_header, payload, entry))
            at += entry_header + payload
        yield found
        position = stop


def main() -> None:
    source, target = sys.argv[1], sys.argv[2]
    with open(source, "rb") as file:
        image = bytearray(file.read())
    offset, length = section_extent(source, image, len(image), ".nv_fatbin")
    zeroed: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    for container in entries(image, offset, offset + length):
        native = any(e.runs_on(HOPPER) == "native" for _, _, e in container)
        for start, size, entry in container:
            verdict = entry.runs_on(HOPPER)
            if verdict == "native" or (verdict == "jit" and not native):
                kept[entry.name] += size
            else:
                image[start : start + size] = bytes(size)
                zeroed[entry.name] += size
    with open(target, "wb") as file:
        file.write(image)
    mb = lambda c: {k: round(v / 2**20, 1) for k, v in sorted(c.items())}  # noqa: E731
    print(f"{source}: kept {mb(kept)} MiB, zeroed {mb(zeroed)} MiB")


if __name__ == "__main__":
    main()
