"""The only code that changes the process: loads the overlay or the shim libraries, sets vLLM's routing
knobs, keeps TMA-only extensions from importing. Idempotent (dlopen of a loaded library returns the same
handle, the knobs merge with what is set), safe in every worker (spawned workers inherit the knobs and
re-run this)."""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass, replace

from . import overlay, trust
from .decision import Decision, Supply
from .libraries import SHIM_FILES, shim_path


@dataclass(frozen=True)
class Outcome:
    done: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()

    def __add__(self, other: Outcome) -> Outcome:
        return Outcome(self.done + other.done, self.failed + other.failed)


def load_shim(library: str, real_driver: str | None) -> ctypes.CDLL:
    """Loads one shim into the global scope, ahead of libcuda.so.1 for every later look-up of its names.
    Only from a trusted path (trust.py): UntrustedPath, an OSError, otherwise."""
    path = trust.trusted_file(shim_path(library))
    return ctypes.CDLL(path, mode=os.RTLD_GLOBAL | os.RTLD_NOW)


def load_overlay(supply: Supply, layer_path: str, real_driver: str | None, runtime_dir: str | None) -> str:
    """Installs and loads the overlay; from then on dlopen("libcuda.so.1") gives it. Returns its path.
    `runtime_dir` None: kept in memory. Raises OverlayError if it did not become libcuda.so.1."""
    path = overlay.install(layer_path, runtime_dir)
    library = ctypes.CDLL(path, mode=os.RTLD_NOW)
    # The loader gives an earlier libcuda.so.1 (loaded unseen: no /proc, another thread) to every later
    # dlopen("libcuda.so.1"); then the overlay answers nothing and the shims must step in.
    answering = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOW | os.RTLD_NOLOAD)
    if answering._handle != library._handle:
        raise overlay.OverlayError(
            f"{path} did not become the process's libcuda.so.1: another one was loaded before it"
        )
    return path


def block_import(module: str) -> bool:
    """Makes `import module` raise ImportError (Python's documented None entry in sys.modules), as if the
    extension had failed to load; False if it is already imported."""
    if sys.modules.get(module) is not None:
        return False
    sys.modules[module] = None  # type: ignore[assignment]
    return True


def _supply(
    supply: Supply, decision: Decision, runtime_dir: str | None, done: list[str], failed: list[str]
) -> None:
    if supply.library == "overlay":
        try:
            path = load_overlay(supply, decision.layer_path or "", decision.real_driver, runtime_dir)
            done.append(f"loaded the overlay {path} ({', '.join(sorted(supply.groups))})")
            return
        except (OSError, AttributeError, overlay.OverlayError) as error:
            failed.append(f"could not load the overlay: {error}; falling back to the shims")
        for library in supply.fallback:
            _supply(Supply(library, (), ""), decision, runtime_dir, done, failed)
        return
    try:
        load_shim(supply.library, decision.real_driver)
        done.append(f"loaded {SHIM_FILES[supply.library]}")
    except (OSError, AttributeError) as error:
        failed.append(f"could not load {shim_path(supply.library)}: {error}")


def apply_supplies(decision: Decision, runtime_dir: str | None) -> Outcome:
    """Loads the overlay or the shims. Must run before anything loads libcuda.so.1, NVML included.
    `runtime_dir`: the guard's private directory for the overlay's file; None: keep it in memory."""
    done: list[str] = []
    failed: list[str] = []
    real = decision.real_driver
    problem = trust.path_problem(real) if real else None
    if problem is not None:  # the shims dlopen it when the layer has not: only from a trusted path
        failed.append(f"not forwarding to the real driver {real}: {problem}")
        decision = replace(decision, real_driver=None)
    for supply in decision.supplies:
        _supply(supply, decision, runtime_dir, done, failed)
    return Outcome(tuple(done), tuple(failed))


def apply_routing(decision: Decision) -> Outcome:
    """Sets vLLM's knobs and keeps TMA-only extensions from importing."""
    done: list[str] = []
    failed: list[str] = []
    routing = decision.routing
    if routing is not None:
        for variable, value in routing.env.items():
            os.environ[variable] = value
            done.append(f"set {variable}={value}")
        for module in routing.block_modules:
            if block_import(module):
                done.append(f"kept {module} from importing")
            else:
                failed.append(f"{module} was imported before the guard ran: it stays selectable")
    return Outcome(tuple(done), tuple(failed))
