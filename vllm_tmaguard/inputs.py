"""What a verdict was decided from, for the verdict cache (verdict.py): the environment variables the stages
read, and the files they read or look for, each list from the module that reads them (docs/design.md §4.1).

  1. environment: LD_LIBRARY_PATH and LD_PRELOAD (the loader's search, HAMi's preload), the toggles
     (TMAGUARD_*), the sharing layers' variables (layers.ENV_PREFIXES) and the knobs routing merges with
     (routing.ENV_NAMES); the stages get these and nothing else (watched_environ), so a test can tell when a
     stage reads one more.
  2. files: the loader's candidates for libcuda.so.1 and ld.so.cache, the real driver's search, the layer
     fingerprints, the kernel module's files, the files the vLLM scan's validity rests on, and the
     components of every path the trust checks walked (the record directory, the package, what was loaded).
A superset is harmless (a few more stat calls per replay); a missing input would replay a stale verdict."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .catalogue import DRIVER_LIBRARY, ENCODERS, overlay_path
from .codes import LOAD_OVERLAY, LOAD_SHIM
from .gpu import gpu_inputs
from .layers import ENV_PREFIXES as LAYER_ENV_PREFIXES
from .layers import evidence_inputs
from .loader import real_driver_inputs, resolution_inputs
from .routing import ENV_NAMES as ROUTING_ENV_NAMES
from .scan_cache import watched_files
from .trust import package_inputs, walk_inputs

if TYPE_CHECKING:
    from .facts import Facts
    from .outcomes import Action

ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD", *ROUTING_ENV_NAMES)
ENV_PREFIXES = ("TMAGUARD_", *LAYER_ENV_PREFIXES)


def watched_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the environment the stages read."""
    return {name: environ[name] for name in environ if name in ENV_NAMES or name.startswith(ENV_PREFIXES)}


def file_inputs(
    facts: Facts, root: str, record_dir: str, actions: tuple[Action, ...]
) -> tuple[list[tuple[str, str]], bool]:
    """(kind, path) of every file input, each once, kinds as verdict.observe_file reads them; and whether
    LD_LIBRARY_PATH was read for more than the loader's search (the real driver's search went through its
    directories): then its value is an input, else its effect on that search is (verdict.by_effect)."""
    driver, environ = facts.driver, facts.environ
    inputs = resolution_inputs(DRIVER_LIBRARY, environ, root, driver.resolution.mapped)
    searched_library_path = False
    if driver.overlay_of:
        inputs.append(("stat", driver.overlay_of))
    if driver.info is not None and ENCODERS[0] not in driver.info.defined:  # probe_driver searched
        searched, searched_library_path = real_driver_inputs(
            driver.info.path, environ, root, driver.real_driver
        )
        inputs += searched + walk_inputs(driver.info.path)
    inputs += evidence_inputs(root) + gpu_inputs(root)
    if facts.vllm.package_dir:
        inputs += [("stat", path) for path in watched_files(facts.vllm.package_dir)]
    if root not in ("", "/"):
        inputs.append(("stat", root))
    trusted = [record_dir, *(a.value for a in actions if a.kind in (LOAD_OVERLAY, LOAD_SHIM) and a.value)]
    if any(a.kind == LOAD_OVERLAY for a in actions):
        trusted.append(overlay_path())
    inputs += package_inputs()
    for path in trusted:
        inputs += walk_inputs(path)
    inputs += [("stat", path) for path in trusted[1:]]  # the libraries' content, besides who may change them
    return list(dict.fromkeys(inputs)), searched_library_path
