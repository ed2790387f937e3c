"""The only code that changes the process: loads the shim libraries, sets vLLM's routing knobs, keeps
TMA-only extensions from importing. Idempotent (dlopen of a loaded library returns the same handle, the
knobs merge with what is set), safe in every worker (spawned workers inherit the knobs and re-run this)."""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

from .decision import Decision

LIBRARY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
SHIM_FILES = {"encoders": "libtmaguard_encoders.so", "proc-address": "libtmaguard_proc_address.so"}


@dataclass(frozen=True)
class Outcome:
    done: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()


def shim_path(library: str) -> str:
    return os.path.join(LIBRARY_DIR, SHIM_FILES[library])


def load_shim(library: str, real_driver: str | None) -> ctypes.CDLL:
    """Loads one shim into the global scope, ahead of libcuda.so.1 for every later look-up of its names."""
    shim = ctypes.CDLL(shim_path(library), mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    shim.tmaguard_shim_set_real_driver.argtypes = [ctypes.c_char_p]
    shim.tmaguard_shim_set_real_driver(os.fsencode(real_driver) if real_driver else None)
    return shim


def block_import(module: str) -> bool:
    """Makes `import module` raise ImportError (Python's documented None entry in sys.modules), as if the
    extension had failed to load; False if it is already imported."""
    if sys.modules.get(module) is not None:
        return False
    sys.modules[module] = None  # type: ignore[assignment]
    return True


def apply(decision: Decision) -> Outcome:
    done, failed = [], []
    for supply in decision.supplies:
        try:
            load_shim(supply.library, decision.real_driver)
            done.append(f"loaded {SHIM_FILES[supply.library]} ({', '.join(supply.symbols)}; {supply.how})")
        except (OSError, AttributeError) as error:
            failed.append(f"could not load {shim_path(supply.library)}: {error}")
    routing = decision.routing
    if routing is not None:
        for variable, value in routing.env.items():
            os.environ[variable] = value
            done.append(f"set {variable}={value}")
        for module in routing.block_modules:
            if block_import(module):
                done.append(f"kept {module} from importing")
            else:
                failed.append(
                    f"{module} was imported before the guard ran: FlashAttention-3 stays selectable"
                )
    return Outcome(tuple(done), tuple(failed))
