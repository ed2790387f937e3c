"""What the doctor reads from binaries beyond the guard's own facts: the GPU code in vLLM's extensions (fat
binary headers, fatbin.py) and who in a vLLM process asks libcuda.so.1 for which entry points (consumers.py),
against what libcuda.so.1 exports and what the guard would supply."""

from __future__ import annotations

from typing import Any

from ..stages.catalogue import overlay_path
from ..stages.elf import ElfError, read_elf
from ..stages.facts import DriverFacts
from ..stages.supply import Supply
from ..stages.vllm_probe import extension_modules
from .consumers import Consumer
from .fatbin import FatbinError, coverage, read_fatbin, sm_name


def read_fatbins(package_dir: str | None) -> list[tuple[str, str, Any]]:
    """(module, path, Fatbin or the FatbinError) of every vLLM extension module with device code."""
    found: list[tuple[str, str, Any]] = []
    for module, path in extension_modules(package_dir) if package_dir else []:
        try:
            fatbin = read_fatbin(path)
        except FatbinError as error:
            found.append((module, path, error))
            continue
        if fatbin.present:  # else host code only (cumem_allocator, spinloop, ...)
            found.append((module, path, fatbin))
    return found


def architectures(fatbins: list[tuple[str, str, Any]], capabilities: list[tuple[int, int]]) -> dict:
    extensions = []
    for module, path, fatbin in fatbins:
        entry: dict[str, Any] = {"module": module, "path": path, "error": None}
        if isinstance(fatbin, FatbinError):
            entry["error"] = fatbin.why
            extensions.append(entry)
            continue
        entry.update(
            {
                "sass": list(fatbin.names("sass")),
                "ptx": list(fatbin.names("ptx")),
                "fatbins": fatbin.containers,
                "arch_specific_only": fatbin.arch_specific_only(),
                "coverage": {},
            }
        )
        for capability in capabilities:
            result = coverage(fatbin, capability)
            entry["coverage"][sm_name(capability)] = {
                "verdict": result.verdict,
                "native": result.native,
                "jit": result.jit,
                "none": result.none,
                "missing": list(result.missing_names),
            }
        extensions.append(entry)
    return {"devices": [sm_name(c) for c in capabilities], "extensions": extensions}


def overlay_exports() -> frozenset[str]:
    """Every driver entry point the shipped overlay carries (read from its file, not from a list of ours)."""
    try:
        return read_elf(overlay_path(), prefixes=(b"cu",)).defined
    except ElfError:
        return frozenset()


def consumer_rows(
    consumers: list[Consumer],
    driver: DriverFacts,
    supplies: tuple[Supply, ...],
    active: bool,
    overlay_answers: frozenset[str],
) -> list[dict[str, Any]]:
    """Each consumer's needs against what libcuda.so.1 exports, and what covers each gap: "overlay" (the
    guard's overlay becomes the process's libcuda.so.1 and answers every entry point it carries, from the
    real driver where the layer lacks it: `overlay_answers`), "shim" (RTLD_GLOBAL: only global-scope
    consumers see it), "off" (the guard would, but is off or not hooked in), "none"."""
    overlay = overlay_answers if any(supply.library == "overlay" for supply in supplies) else frozenset()
    shims = {s for supply in supplies if supply.library != "overlay" for s in supply.symbols}
    rows = []
    for consumer in consumers:
        lacks = [s for s in consumer.needs if not driver.exports(s)] if driver.info is not None else None
        cover = {}
        for symbol in lacks or []:
            if symbol in overlay or (consumer.scope == "global" and symbol in shims):
                cover[symbol] = ("overlay" if symbol in overlay else "shim") if active else "off"
            else:
                cover[symbol] = "none"
        rows.append(
            {
                "name": consumer.name,
                "kind": consumer.kind,
                "path": consumer.path,
                "scope": consumer.scope,
                "loaded": consumer.loaded,
                "needs": list(consumer.needs),
                "lacks": lacks,
                "coverage": cover,
                "evidence": consumer.evidence,
                "error": consumer.error,
                "absent": consumer.absent,
            }
        )
    return rows
