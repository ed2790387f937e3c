"""How the process's command line tells vLLM to run: whether it runs eager (every kernel launched on its own,
no CUDA graphs), read from the flags the way vLLM's own argument parser reads them (docs/design.md §3.3).
Pure: the caller passes sys.argv. A spawned vLLM child (EngineCore, workers) has its parent's argv by the
time the guard runs (multiprocessing's spawn restores it before vLLM is imported).

Seen: `--enforce-eager` (and `--no-enforce-eager`, underscores too), optimization level 0 (`-O0`, `-O 0`,
`-O=0`, `--optimization-level[=]0`), and `cudagraph_mode` NONE in the compilation config (`-cc`/
`--compilation-config` JSON, or `-cc.cudagraph_mode=NONE`). Not seen: a `--config` YAML file and the offline
`LLM(enforce_eager=True)`; there `TMAGUARD_GEMM=latency` says the same."""

from __future__ import annotations

import json
from collections.abc import Sequence

_EAGER = "--enforce-eager"
_NOT_EAGER = "--no-enforce-eager"
_LEVEL = "--optimization-level"
_COMPILATION = "--compilation-config"
_GRAPH_MODE = "cudagraph_mode"


def _normal(arg: str) -> str:
    """vLLM's spelling: underscores to dashes in a long option's name (up to its first '.' or '=');
    `-cc` is `--compilation-config`."""
    if arg.startswith("-cc") and (len(arg) == 3 or arg[3] in ".="):
        arg = _COMPILATION + arg[3:]
    if not arg.startswith("--"):
        return arg
    name, sep, value = arg.partition("=")
    head, dot, rest = name.partition(".")
    return head.replace("_", "-") + dot + rest + sep + value


def _graph_mode_none(value: str) -> bool | None:
    """A compilation config's cudagraph_mode: True for NONE, False for another, None where it says none."""
    try:
        config = json.loads(value)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth: vLLM refuses it too
        return None
    mode = config.get(_GRAPH_MODE) if isinstance(config, dict) else None
    return None if mode is None else str(mode).upper() == "NONE"


def eager_flag(argv: Sequence[str]) -> str | None:
    """The flag that makes vLLM run eager, as written on the command line, or None where vLLM keeps its CUDA
    graphs (or the command line does not say). As vLLM decides: `--enforce-eager` wins over the rest, an
    explicit cudagraph_mode over the optimization level's default; within one setting the last one counts."""
    enforce: str | None = None
    level: tuple[str, str] | None = None  # (the level, as written)
    graph_mode: tuple[str, str] | None = None
    args = list(argv[1:])
    for index, raw in enumerate(args):
        arg = _normal(raw)
        following = args[index + 1] if index + 1 < len(args) else ""
        if arg in (_EAGER, _NOT_EAGER):
            enforce = raw if arg == _EAGER else None
        elif arg.startswith("-O") and not arg.startswith("--"):
            value = following if arg == "-O" else arg[2:].removeprefix("=")
            if value in {"0", "1", "2", "3"}:
                level = (value, f"{raw} {value}" if arg == "-O" else raw)
        elif arg == _LEVEL or arg.startswith(_LEVEL + "="):
            value = following if arg == _LEVEL else arg.partition("=")[2]
            level = (value, f"{raw} {value}" if arg == _LEVEL else raw)
        elif arg == _COMPILATION or arg.startswith(_COMPILATION + "="):
            config = following if arg == _COMPILATION else arg.partition("=")[2]
            none = _graph_mode_none(config)
            if none is not None:
                written = f"{raw} '{config}'" if arg == _COMPILATION else raw
                graph_mode = ("NONE" if none else "graphs", written)
        elif arg.startswith(f"{_COMPILATION}.{_GRAPH_MODE}"):
            value = arg.partition("=")[2] if "=" in arg else following
            graph_mode = (value.upper(), raw if "=" in arg else f"{raw} {value}")
    if enforce:
        return enforce
    if graph_mode is not None:
        return graph_mode[1] if graph_mode[0] == "NONE" else None
    return level[1] if level is not None and level[0] == "0" else None
