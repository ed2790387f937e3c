"""The guard's changes to the process, from the plans: loads the overlay or the shim libraries, sets vLLM's
routing knobs, keeps TMA-only extensions from importing (each change itself is process.py's). Idempotent
(dlopen of a loaded library returns the same handle, the knobs merge with what is set), safe in every worker
(spawned workers inherit the knobs and re-run this). With apply=False (validate mode, `tmaguard check`) it
changes nothing and returns the actions auto mode would take."""

from __future__ import annotations

import os

from ..codes import (
    BLOCK_IMPORT,
    IMPORTED_EARLY,
    LOAD_OVERLAY,
    LOAD_SHIM,
    OVERLAY_FAILED,
    SET_ARG,
    SET_ENV,
    SHIM_FAILED,
)
from ..process import add_arg, answering, block_import, load_library
from . import overlay, trust
from .catalogue import DRIVER_LIBRARY, overlay_path, shim_path
from .outcomes import Action, Problem
from .routing import Routing
from .supply import Supply

Outcome = tuple[tuple[Action, ...], tuple[Problem, ...]]


def load_shim(library: str) -> str:
    """Loads one shim into the global scope, ahead of libcuda.so.1 for every later look-up of its names.
    Only from a trusted path (trust.py): UntrustedPath, an OSError, otherwise. Returns its path."""
    path = trust.trusted_file(shim_path(library))
    load_library(path, global_scope=True)
    return path


def load_overlay(layer_path: str, runtime_dir: str | None) -> str:
    """Installs and loads the overlay; from then on dlopen("libcuda.so.1") gives it. Returns its path.
    `runtime_dir` None: kept in memory. Raises OverlayError if it did not become libcuda.so.1."""
    path = overlay.install(layer_path, runtime_dir)
    handle = load_library(path)
    # The loader gives an earlier libcuda.so.1 (loaded unseen: no /proc, another thread) to every later
    # dlopen("libcuda.so.1"); then the overlay answers nothing and the shims must step in.
    if answering(DRIVER_LIBRARY) != handle:
        raise overlay.OverlayError(
            f"{path} did not become the process's libcuda.so.1: another one was loaded before it"
        )
    return path


def _load_shim(library: str, apply: bool) -> Outcome:
    if not apply:
        return (Action(LOAD_SHIM, library, shim_path(library), applied=False),), ()
    try:
        return (Action(LOAD_SHIM, library, load_shim(library)),), ()
    except (OSError, AttributeError) as error:
        problem = Problem(
            SHIM_FAILED,
            cause=f"could not load {shim_path(library)}: {error}",
            consequence="vLLM's extensions that need its entry points fail to import",
            fix="reinstall vllm-tmaguard (its wheel carries the shims)",
            subject=library,
        )
        return (), (problem,)


def _load_overlay(supply: Supply, layer_path: str, runtime_dir: str | None, apply: bool) -> Outcome:
    if not apply:
        return (Action(LOAD_OVERLAY, "overlay", overlay_path(), applied=False),), ()
    try:
        path = load_overlay(layer_path, runtime_dir)
        return (Action(LOAD_OVERLAY, "overlay", path, in_memory=path.startswith("/proc/self/fd/")),), ()
    except (OSError, AttributeError, overlay.OverlayError) as error:
        failed = Problem(
            OVERLAY_FAILED,
            cause=f"could not load the overlay: {error}",
            consequence="the CUDA runtime and Triton cannot reach what the layer lacks; the shims stand in",
            fix="see `tmaguard doctor`; or install the overlay from the manifest (`tmaguard env`)",
        )
    actions: tuple[Action, ...] = ()
    problems: tuple[Problem, ...] = (failed,)
    for library in supply.fallback:
        more_actions, more_problems = _load_shim(library, apply)
        actions, problems = actions + more_actions, problems + more_problems
    return actions, problems


def apply_supply(
    supplies: tuple[Supply, ...], layer_path: str, runtime_dir: str | None, apply: bool
) -> Outcome:
    """Loads the overlay or the shims. Must run before anything loads libcuda.so.1, NVML included.
    `runtime_dir`: the guard's private directory for the overlay's file; None: keep it in memory."""
    actions: tuple[Action, ...] = ()
    problems: tuple[Problem, ...] = ()
    for supply in supplies:
        if supply.library == "overlay":
            more = _load_overlay(supply, layer_path, runtime_dir, apply)
        else:
            more = _load_shim(supply.library, apply)
        actions, problems = actions + more[0], problems + more[1]
    return actions, problems


def apply_routing(routing: Routing, apply: bool) -> Outcome:
    """Sets vLLM's knobs and keeps TMA-only extensions from importing."""
    actions = []
    problems = []
    for variable, value in routing.env.items():
        if apply:
            os.environ[variable] = value
        actions.append(Action(SET_ENV, variable, value, applied=apply))
    for module in routing.block_modules:
        if not apply or block_import(module):
            actions.append(Action(BLOCK_IMPORT, module, applied=apply))
        else:
            problems.append(
                Problem(
                    IMPORTED_EARLY,
                    cause=f"{module} was imported before the guard ran",
                    consequence="it stays selectable, and its TMA kernels crash without a real encoder",
                    fix="let the guard run first: import vllm before anything imports the extension",
                    subject=module,
                )
            )
    return tuple(actions), tuple(problems)


def apply_launch(env: dict[str, str], args: tuple[tuple[str, str], ...], apply: bool) -> tuple[Action, ...]:
    """Sets the variables vLLM reads at its import (its compat switch) and adds flags to the server's command
    line before vLLM parses it (memory.py, compat.py)."""
    actions = []
    for variable, value in env.items():
        if apply:
            os.environ[variable] = value
        actions.append(Action(SET_ENV, variable, value, applied=apply))
    for flag, value in args:
        if not apply or add_arg(flag, value):
            actions.append(Action(SET_ARG, flag, value, applied=apply))
    return tuple(actions)


def replay_plan(actions: tuple[Action, ...]) -> dict[str, object]:
    """The applied actions as the changes a process replaying this verdict makes (verdict.redo): libraries
    to load in order, each with its scope and the name it must answer; variables to set; modules to block;
    flags to add to the server's command line."""
    loads: list[list[object]] = []
    env: dict[str, str] = {}
    block: list[str] = []
    args: list[list[str]] = []
    for action in actions:
        if not action.applied:
            continue
        if action.kind == LOAD_OVERLAY:
            loads.append([action.value, False, DRIVER_LIBRARY])
        elif action.kind == LOAD_SHIM:
            loads.append([action.value, True, None])
        elif action.kind == SET_ENV:
            env[action.target] = action.value or ""
        elif action.kind == BLOCK_IMPORT:
            block.append(action.target)
        elif action.kind == SET_ARG:
            args.append([action.target, action.value or ""])
    return {"load": loads, "env": env, "block": block, "args": args}
