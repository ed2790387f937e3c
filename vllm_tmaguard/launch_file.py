"""The vLLM config file a process's command line names (`vllm serve MODEL --config serve.yaml`), read the way
vLLM reads it (PyYAML's safe loader, a mapping at the top) so that its eager settings count (process.py).

The file is the operator's, and vLLM opens it right after the guard: the guard must never take it from vLLM or
wait on it. It reads only a regular file (a FIFO or a device would block, or hand the guard bytes meant for
vLLM), opened without blocking, of at most MAX_BYTES (vLLM's own configs are a few hundred bytes); anything
else, or YAML vLLM would refuse, counts as no file: vLLM then says what is wrong with it."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .files import read_shared_file
from .process import config_path, eager_flag, memory_settings

MAX_BYTES = 256 << 10
_SUFFIXES = (".yaml", ".yml")  # vLLM refuses any other (FlexibleArgumentParser.load_config_file)


def read_config(path: str) -> Mapping[Any, Any] | None:
    """The mapping in the YAML file at `path`, or None where vLLM would refuse it or the guard must not read
    it (not a regular file, over MAX_BYTES, not YAML, not a mapping)."""
    if not path.endswith(_SUFFIXES):
        return None
    try:
        data = read_shared_file(path, MAX_BYTES)
    except OSError:
        return None
    try:
        import yaml  # vLLM's own dependency, imported by vLLM right after; paid only where --config is given

        config = yaml.safe_load(data)
    except Exception:  # no PyYAML (then no vLLM either), or YAML vLLM cannot load (RecursionError too)
        return None
    return config if isinstance(config, Mapping) else None


def process_eager_flag(argv: Sequence[str] | None = None) -> str | None:
    """launch.eager_flag for this process (`argv`: sys.argv), its `--config` file read."""
    argv = sys.argv if argv is None else argv
    path = config_path(argv)
    return eager_flag(argv, read_config(path) if path is not None else None)


def process_settings(argv: Sequence[str] | None = None) -> tuple[str | None, str | None, str | None]:
    """(eager flag, --gpu-memory-utilization, --kv-cache-memory-bytes) for this process (`argv`: sys.argv),
    its `--config` file read once for all three."""
    argv = sys.argv if argv is None else argv
    path = config_path(argv)
    config = read_config(path) if path is not None else None
    return (eager_flag(argv, config), *memory_settings(argv, config))
