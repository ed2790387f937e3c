"""This process, as the guard sees and changes it. Read passively (nothing loaded or imported): where a
package would be imported from; what its command line tells vLLM (the shared objects it has loaded:
loaded.py, which a replay rarely needs). Changed only here: a library loaded, a module kept from importing, a
flag added to the command line (the environment variables the guard sets are os.environ's). Standard library
only: the verdict cache (verdict.py) uses it in every vLLM process; actions.py decides what to change.

The command line (docs/design.md §3.3), read from the flags the way vLLM's own argument parser reads them,
pure (the caller passes sys.argv; a spawned vLLM child has its parent's argv by the time the guard runs:
multiprocessing's spawn restores it before vLLM is imported): whether vLLM runs eager (every kernel launched
on its own, no CUDA graphs), whether the process is a server's front, its memory flags.
Seen: `--enforce-eager` (and `--no-enforce-eager`, underscores too), optimization level 0 (`-O0`, `-O 0`,
`-O=0`, `--optimization-level[=]0`), and `cudagraph_mode` NONE in the compilation config (`-cc`/
`--compilation-config` JSON, or `-cc.cudagraph_mode=NONE`); the same settings in a `--config` YAML file, whose
mapping the caller reads (launch_file.py) and whose settings count before the command line's, as vLLM
inserts them. Not seen: the offline `LLM(enforce_eager=True)`; there `TMAGUARD_GEMM=latency` says the same."""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from . import files

LIBRARY_PATH = "LD_LIBRARY_PATH"


def split_library_path(value: str, cwd: str) -> list[str]:
    """LD_LIBRARY_PATH as glibc reads it: ':' or ';' separated; an empty entry means the current directory."""
    if not value:
        return []
    entries = value.replace(";", ":").split(":")
    return [os.path.join(cwd, entry) if not os.path.isabs(entry) else entry for entry in entries]


def find_package_dirs(name: str, search_path: list[str] | None = None) -> list[str]:
    """Every directory of the package (several for a namespace package such as `cuda` or `nvidia`), located
    like `import` would, without executing it (and without meta-path hooks, so the guard's own import hook
    is not re-entered). `search_path`: instead of sys.path."""
    spec = importlib.machinery.PathFinder.find_spec(name, sys.path if search_path is None else search_path)
    if spec is None or not spec.submodule_search_locations:
        return []
    return list(spec.submodule_search_locations)


def find_package_dir(name: str = "vllm", search_path: list[str] | None = None) -> str | None:
    """The package's (first) directory; see find_package_dirs."""
    return next(iter(find_package_dirs(name, search_path)), None)


def _dlopen(name: str, mode: int) -> int:
    """dlopen's handle. ctypes.CDLL makes the same call, and defines a class for every library it opens
    (tens of microseconds, in every vLLM process). Raises OSError (dlerror's message)."""
    from _ctypes import dlopen

    return dlopen(name, mode)


def load_library(path: str, global_scope: bool = False) -> int:
    """dlopen(path, RTLD_NOW, and RTLD_GLOBAL if asked); its handle. Raises OSError."""
    return _dlopen(path, os.RTLD_NOW | (os.RTLD_GLOBAL if global_scope else 0))


def answering(name: str) -> int | None:
    """The handle dlopen(name) gives from now on, if a loaded object answers that name (RTLD_NOLOAD: loads
    nothing)."""
    try:
        return _dlopen(name, os.RTLD_NOW | os.RTLD_NOLOAD)
    except OSError:
        return None


def block_import(module: str) -> bool:
    """Makes `import module` raise ImportError (Python's documented None entry in sys.modules), as if the
    extension had failed to load; False if it is already imported."""
    if sys.modules.get(module) is not None:
        return False
    sys.modules[module] = None  # type: ignore[assignment]
    return True


def add_arg(flag: str, value: str) -> bool:
    """Adds `flag value` to the command line vLLM's parser reads after the guard (sys.argv), unless the flag
    is there already; False then. vLLM's parser takes the last of a repeated flag, so nothing the user wrote
    is ever overridden by this."""
    if any(arg == flag or arg.startswith(flag + "=") for arg in sys.argv[1:]):
        return False
    sys.argv.extend([flag, value])
    return True


def module_run() -> str | None:
    """The module `python -m` runs in this process, from /proc/self/cmdline (sys.argv[0] is "-m" while its
    package is imported, when the guard runs); None for any other command."""
    try:  # /proc/self is this process itself, not a verdict input (docs/design.md §4.1)
        words = files.read_bytes("/proc/self/cmdline", 1 << 20, noted=False).split(b"\0")
    except OSError:
        return None
    for index, word in enumerate(words[1:], start=1):
        if word == b"-m" and index + 1 < len(words):
            return words[index + 1].decode(errors="replace")
        if not word.startswith(b"-"):
            return None
    return None


# ---------------------------------------------------------------------------------------------------------
# The command line

_EAGER = "--enforce-eager"
_NOT_EAGER = "--no-enforce-eager"
_LEVEL = "--optimization-level"
_COMPILATION = "--compilation-config"
_GRAPH_MODE = "cudagraph_mode"
CONFIG = "--config"
_SETTINGS = (_EAGER, _LEVEL, _COMPILATION)  # what a config file can say about eager, as long options
_FRACTION = ("--gpu-memory-utilization", "--device-memory-utilization")  # one setting, two names
_KV_CACHE = "--kv-cache-memory-bytes"
MEMORY_SETTINGS = (*_FRACTION, _KV_CACHE)
# How vLLM's server is started: the `vllm` command's `serve`, or a module run with `python -m`, whose
# package is imported while sys.argv[0] is still "-m" (the module's name is then in /proc/self/cmdline).
_CLI_MODULE, _API_MODULE = "vllm.entrypoints.cli.main", "vllm.entrypoints.openai.api_server"
_CLI_FILE, _API_FILE = "vllm/entrypoints/cli/main.py", "vllm/entrypoints/openai/api_server.py"


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


def config_path(argv: Sequence[str]) -> str | None:
    """The YAML file the command line names with `--config PATH`, as vLLM's parser finds it (that exact token,
    once; the path as written, relative to the working directory), or None."""
    args = list(argv[1:])
    if args.count(CONFIG) != 1 or args.index(CONFIG) == len(args) - 1:
        return None  # none, or vLLM refuses the command line (two files, no path)
    return args[args.index(CONFIG) + 1]


def config_args(config: Mapping[Any, Any], settings: tuple[str, ...] = _SETTINGS) -> list[str]:
    """A config file's `settings` (eager's, by default) as the command-line arguments vLLM makes of them (its
    FlexibleArgumentParser.load_config_file: `key: true` is `--key`, `enforce-eager: false` is
    `--no-enforce-eager`, a mapping its JSON), the other keys left out. Of a compilation config only its
    cudagraph_mode is kept: no mapping is serialised whole (YAML aliases can make that exponential)."""
    tokens: list[str] = []
    for key, value in config.items():
        if not isinstance(key, str) or _normal("--" + key).partition(".")[0] not in settings:
            continue
        option = "--" + key
        if isinstance(value, bool):
            if value:
                tokens.append(option)
            elif option == _EAGER:  # vLLM adds --no-KEY only where that option exists, as KEY is spelt
                tokens.append(_NOT_EAGER)
        elif isinstance(value, Mapping):
            mode = value.get(_GRAPH_MODE)
            tokens += [option, json.dumps({} if mode is None else {_GRAPH_MODE: _scalar(mode)})]
        elif isinstance(value, list):
            tokens += [option, *(_scalar(item) for item in value)] if value else []
        else:
            tokens += [option, _scalar(value)]
    return tokens


def _scalar(value: Any) -> str:
    """A YAML scalar as vLLM writes it into an argument (str()); anything else as a value no setting takes,
    never stringified (a structure of YAML aliases is exponential to print)."""
    return str(value) if isinstance(value, (str, int, float)) else "<not a scalar>"


def eager_flag(argv: Sequence[str], config: Mapping[Any, Any] | None = None) -> str | None:
    """The flag that makes vLLM run eager, as written on the command line (or in the `--config` file, whose
    mapping is `config`), or None where vLLM keeps its CUDA graphs (or neither says). As vLLM decides:
    `--enforce-eager` wins over the rest, an explicit cudagraph_mode over the optimization level's default;
    within one setting the last one counts, and the command line's come after the file's."""
    enforce: tuple[str, int] | None = None  # (as written, where)
    level: tuple[str, str, int] | None = None  # (the level, as written, where)
    graph_mode: tuple[str, str, int] | None = None
    args = list(argv[1:])
    path = config_path(argv)
    from_file = 0
    if path is not None:
        at = args.index(CONFIG)
        file_args = config_args(config) if config is not None else []
        args, from_file = file_args + args[:at] + args[at + 2 :], len(file_args)
    for index, raw in enumerate(args):
        arg = _normal(raw)
        following = args[index + 1] if index + 1 < len(args) else ""
        if arg in (_EAGER, _NOT_EAGER):
            enforce = (raw, index) if arg == _EAGER else None
        elif arg.startswith("-O") and not arg.startswith("--"):
            value = following if arg == "-O" else arg[2:].removeprefix("=")
            if value in {"0", "1", "2", "3"}:
                level = (value, f"{raw} {value}" if arg == "-O" else raw, index)
        elif arg == _LEVEL or arg.startswith(_LEVEL + "="):
            value = following if arg == _LEVEL else arg.partition("=")[2]
            level = (value, f"{raw} {value}" if arg == _LEVEL else raw, index)
        elif arg == _COMPILATION or arg.startswith(_COMPILATION + "="):
            compilation = following if arg == _COMPILATION else arg.partition("=")[2]
            none = _graph_mode_none(compilation)
            if none is not None:
                written = f"{raw} '{compilation}'" if arg == _COMPILATION else raw
                graph_mode = ("NONE" if none else "graphs", written, index)
        elif arg.startswith(f"{_COMPILATION}.{_GRAPH_MODE}"):
            value = arg.partition("=")[2] if "=" in arg else following
            graph_mode = (value.upper(), raw if "=" in arg else f"{raw} {value}", index)

    def written(text: str, index: int) -> str:
        return f"{text} (in {CONFIG} {path})" if index < from_file else text

    if enforce:
        return written(*enforce)
    if graph_mode is not None:
        return written(*graph_mode[1:]) if graph_mode[0] == "NONE" else None
    return written(*level[1:]) if level is not None and level[0] == "0" else None


def is_server(argv: Sequence[str], module: str | None = None) -> bool:
    """The process is the front of a vLLM server, whose command line vLLM's parser reads after the guard:
    `vllm serve`, `python -m vllm.entrypoints.cli.main serve`, `python -m vllm.entrypoints.openai.api_server`
    (`module`: the module `python -m` runs, where argv[0] is still "-m"). A spawned child of it has its
    argv, and so counts too: its flags were given to the front."""
    if not argv:
        return False
    first, subcommand = argv[0], argv[1] if len(argv) > 1 else ""
    if first == "-m":
        return module == _API_MODULE or (module == _CLI_MODULE and subcommand == "serve")
    if first.endswith(_API_FILE):
        return True
    cli = first.endswith(_CLI_FILE) or first.rsplit("/", 1)[-1] == "vllm"
    return cli and subcommand == "serve"


def memory_settings(
    argv: Sequence[str], config: Mapping[Any, Any] | None = None
) -> tuple[str | None, str | None]:
    """(--gpu-memory-utilization, --kv-cache-memory-bytes) as written on the command line or in its `--config`
    file (whose settings count before the command line's, the last one of each winning), or None each."""
    args = list(argv[1:])
    path = config_path(argv)
    if path is not None:
        at = args.index(CONFIG)
        file_args = config_args(config, MEMORY_SETTINGS) if config is not None else []
        args = file_args + args[:at] + args[at + 2 :]
    found: dict[str, str | None] = {_FRACTION[0]: None, _KV_CACHE: None}
    for index, raw in enumerate(args):
        name, sep, value = _normal(raw).partition("=")
        if name in MEMORY_SETTINGS:
            setting = _FRACTION[0] if name in _FRACTION else _KV_CACHE
            found[setting] = value if sep else (args[index + 1] if index + 1 < len(args) else None)
    return found[_FRACTION[0]], found[_KV_CACHE]
