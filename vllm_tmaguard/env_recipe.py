"""`tmaguard env`: the manifest-level fix for a pod where the guard cannot put the overlay in front of
libcuda.so.1 in-process (something loads libcuda.so.1 first): install the overlay once per container and
put its directory first on LD_LIBRARY_PATH, so every process's dlopen("libcuda.so.1") finds it."""

from __future__ import annotations

import os
import tempfile

from .decision import OVERLAY_GROUPS, overlay_groups
from .facts import Facts
from .overlay import overlay_image

DEFAULT_INSTALL_DIR = "/opt/tmaguard"


def install(image: bytes, directory: str) -> str:
    """Writes <directory>/libcuda.so.1 atomically (world-readable: every user of the container needs it)."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".libcuda.")
    with os.fdopen(fd, "wb") as file:
        file.write(image)
    os.chmod(temporary, 0o555)
    path = os.path.join(directory, "libcuda.so.1")
    os.replace(temporary, path)
    return path


def recipe(facts: Facts, environ: dict[str, str], install_dir: str | None) -> tuple[list[str], int]:
    """The lines to print and the exit code (0: nothing needed or done; 1: cannot help here)."""
    driver = facts.driver
    if driver.overlay_of:
        return [
            f"# libcuda.so.1 is already the tmaguard overlay ({driver.path}) in front of "
            f"{driver.overlay_of}: nothing to add"
        ], 0
    if driver.path is None or driver.info is None:
        return [
            f"# libcuda.so.1 not found or unreadable ({driver.error or driver.resolution.how}): nothing the "
            "overlay can stand in front of"
        ], 1
    groups = overlay_groups(facts)
    if not groups:
        return [f"# {driver.path} exports every entry point the overlay would add: nothing to do"], 0
    names = ", ".join(OVERLAY_GROUPS[group][0] for group in sorted(groups))
    layer = facts.layers[0].name if facts.layers else "libcuda.so.1"
    directory = install_dir or DEFAULT_INSTALL_DIR
    library_path = ":".join([directory, *[p for p in environ.get("LD_LIBRARY_PATH", "").split(":") if p]])
    lines = [
        f"# {layer}: {driver.path} lacks {names}.",
        "# The overlay is a libcuda.so.1 that loads that file and adds only these entry points; the layer",
        "# keeps metering every other driver call. Every process must find it first on its library path.",
    ]
    if install_dir:
        lines.append(f"# installed {install(overlay_image(driver.path), install_dir)}")
    else:
        lines += [
            "# 1. once per container, before vLLM starts (an init container sharing the volume, or the",
            "#    container's entrypoint; not the image build: the layer's file is mounted at run time):",
            f"tmaguard env --install-dir {directory}",
        ]
        lines.append(
            "# 2. in the container's environment (Kubernetes: env: [{name: LD_LIBRARY_PATH, value: ...}]):"
        )
    lines.append(f"export LD_LIBRARY_PATH={library_path}")
    return lines, 0
