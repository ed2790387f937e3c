"""`tmaguard env`: the manifest-level fix for a pod where the guard cannot put the overlay in front of
libcuda.so.1 in-process (something loads libcuda.so.1 first): install the overlay once per container and
put its directory first on LD_LIBRARY_PATH, so every process's dlopen("libcuda.so.1") finds it."""

from __future__ import annotations

from .. import files
from ..stages import door, trust
from ..stages.catalogue import OVERLAY_TRIGGERS
from ..stages.facts import Facts
from ..stages.overlay import overlay_image
from ..stages.supply import swapped_lookups

DEFAULT_INSTALL_DIR = "/opt/tmaguard"


def install(image: bytes, directory: str) -> list[str]:
    """Writes <directory>/libcuda.so.1 atomically, world-readable (every user of the container needs it), into
    a directory only root or this user can change (made 0755 first where it is this user's and wider:
    kubelet makes emptyDir volumes 0777); what it did, as lines to print. Raises OSError
    (trust.UntrustedPath, files.Refused) otherwise."""
    tightened = trust.make_install_dir(directory)
    path = door.install_file(directory, "libcuda.so.1", image, 0o555)
    return [*([f"# {tightened}"] if tightened else []), f"# installed {path}"]


def _why(error: OSError) -> str:
    """A refusal's reason (the path it names included), or the system's."""
    if isinstance(error, (trust.UntrustedPath, files.Refused)):
        return error.why
    return error.strerror or str(error)


def _refusal(facts: Facts, root: str) -> str | None:
    """Why no overlay may be written for this layer file: one found through TMAGUARD_ROOT (not what this
    process's loader finds). One that others can change is no refusal: the loader loads it into every
    process anyway, as the guard's overlay does (recipe warns, with the guard's own problem)."""
    return trust.probe_root_problem(root, facts.driver.resolution.how, facts.driver.path)


def recipe(
    facts: Facts, environ: dict[str, str], install_dir: str | None, root: str = "/"
) -> tuple[list[str], int]:
    """The lines to print and the exit code (0: nothing needed or done; 1: cannot help here, or refused)."""
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
    lacking = [name for name in OVERLAY_TRIGGERS if name not in driver.info.defined]
    swapped = swapped_lookups(facts)
    if not lacking and not swapped:
        return [f"# {driver.path} exports every entry point the overlay would add: nothing to do"], 0
    refused = _refusal(facts, root)
    if refused is not None:
        return [f"# refused: {refused}; nothing installed"], 1
    layer = facts.layers[0].label if facts.layers else "libcuda.so.1"
    directory = install_dir or DEFAULT_INSTALL_DIR
    others = [p for p in environ.get("LD_LIBRARY_PATH", "").split(":") if p and p != directory]
    library_path = ":".join([directory, *others])
    why = (
        f"lacks {', '.join(lacking)} (and the rest of CUDA 12's entry points)."
        if lacking
        else f"answers {', '.join(swapped)} with its legacy-ABI hooks (CUDA_ERROR_INVALID_CONTEXT)."
    )
    lines = [
        f"# {layer}: {driver.path} {why}",
        "# The overlay is a libcuda.so.1 that loads that file and adds only what it lacks (and answers the",
        "# look-ups itself); the layer keeps metering every call it knows. Every process must find it first",
        "# on its library path.",
    ]
    writable = trust.writable_layer(driver.path, driver.resolution.how, root)
    if writable is not None:  # the guard's record carries the same problem (pipeline.decide)
        lines += [f"# warning: {writable.cause}", f"# ({writable.consequence}); fix: {writable.fix}"]
    if install_dir:
        try:
            lines += install(overlay_image(driver.path), install_dir)
        except OSError as error:
            fix = "make it a directory only root or this user can write to (chmod 0755), or choose another"
            return [*lines, f"# refused: {install_dir}: {_why(error)}; {fix}"], 1
    else:
        lines += [
            "# 1. in the vLLM container itself, before vLLM starts (its command: an init container does not",
            "#    see the layer's file, mounted by the device plugin into the container requesting the GPU):",
            f"tmaguard env --install-dir {directory}",
            "# 2. in that container's environment (Kubernetes: env: [{name: LD_LIBRARY_PATH, value: ...}]):",
        ]
    lines.append(f"export LD_LIBRARY_PATH={library_path}")
    return lines, 0
