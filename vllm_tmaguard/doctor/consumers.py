"""Who else in a vLLM process asks libcuda.so.1 for driver entry points, and how, read from files only
(nothing is imported or loaded): torch's lazily loaded libraries, the CUDA runtime, Triton's launcher and
cuda-python. vLLM's own extensions come from vllm_probe.

Two ways to ask, and they matter for what can fill a gap (docs/design.md §2.1, §2.2):
- "global": the loader binds the name when the library is loaded (NEEDED libcuda.so.1, undefined symbol);
  the process's global scope is searched first, so the guard's RTLD_GLOBAL shim reaches it.
- "handle": the consumer calls dlopen("libcuda.so.1") and dlsym() on that handle (or asks the driver's
  cuGetProcAddress_v2 found that way); only libcuda.so.1's own dependency tree is searched, so an
  RTLD_GLOBAL shim cannot reach it: only a libcuda.so.1 that carries the name itself can (the overlay)."""

import errno
import os
import re
from typing import NamedTuple

from ..process import find_package_dir, find_package_dirs
from ..stages import door
from ..stages.catalogue import DRIVER_LIBRARY, LAUNCH_EX, PROC_ADDRESS_V2
from ..stages.elf import ElfError, read_elf
from ..stages.vllm_probe import VllmFacts, scan_extension

# triton/backends/nvidia/driver.c: defineGetFunctionHandle(getLaunchKernelExHandle, cuLaunchKernelEx);
_TRITON_HANDLE_LOOKUP = re.compile(r"defineGetFunctionHandle\(\s*\w+\s*,\s*(cu[A-Z]\w*)\s*\)")
_CUDART = re.compile(r"^libcudart(?:-[0-9a-f]+)?\.so\.(\d+)")


class Consumer(NamedTuple):
    name: str  # vllm._C_stable_libtorch, torch.lib.libcaffe2_nvrtc, libcudart.so.13, triton, cuda-python
    kind: str  # vllm-extension, torch-library, cuda-runtime, triton, cuda-python
    path: str | None
    scope: str  # "global" or "handle" (see the module docstring)
    loaded: str  # when the process asks: "import", "lazily", "first CUDA call", "every kernel launch"
    needs: tuple[str, ...]  # driver entry points it asks libcuda.so.1 for
    evidence: str  # how the needs were read
    error: str | None = None  # the file could not be read
    absent: bool = False  # the file is not there (its package lists it)


def site_path(vllm_dir: str | None, path: list[str]) -> list[str]:
    """Where to look for torch, Triton and the CUDA runtime: beside an explicitly given vLLM first."""
    return ([os.path.dirname(os.path.abspath(vllm_dir))] if vllm_dir else []) + list(path)


def vllm_consumers(vllm: VllmFacts) -> list[Consumer]:
    return [
        Consumer(
            extension.module,
            "vllm-extension",
            extension.path,
            "global",
            "import" if extension.module in vllm.imported_at_platform_load else "import (when used)",
            tuple(sorted(extension.driver_symbols)),
            "undefined cu* symbols in .dynsym (NEEDED libcuda.so.1)",
            extension.error,
            extension.absent,
        )
        for extension in vllm.extensions
    ]


def torch_consumers(path: list[str]) -> list[Consumer]:
    """torch/lib/*.so that link libcuda.so.1 (torch dlopens them lazily, e.g. libcaffe2_nvrtc.so for JIT)."""
    torch_dir = find_package_dir("torch", path)
    if torch_dir is None:
        return []
    found = []
    for library in door.glob(os.path.join(torch_dir, "lib", "*.so*")):
        try:  # NEEDED only: cheap even for libtorch_cuda.so; symbols only for those linking the driver
            if DRIVER_LIBRARY not in read_elf(library, symbols=False).needed:
                continue
        except ElfError as error:
            found.append(
                _unreadable(library, "torch-library", "global", error.why, error.errno == errno.ENOENT)
            )
            continue
        extension = scan_extension(torch_dir, library)
        if extension is not None:
            found.append(
                Consumer(
                    extension.module,
                    "torch-library",
                    library,
                    "global",
                    "lazily (torch dlopens it on first use)",
                    tuple(sorted(extension.driver_symbols)),
                    "undefined cu* symbols in .dynsym (NEEDED libcuda.so.1)",
                    extension.error,
                )
            )
    return found


def _contains(path: str, needle: bytes) -> bool:
    with door.mapped(path) as (image, _):
        return image.find(needle) >= 0


def _unreadable(path: str, kind: str, scope: str, why: str, absent: bool = False) -> Consumer:
    return Consumer(os.path.basename(path), kind, path, scope, "", (), "", why, absent)


def cudart_consumers(path: list[str]) -> list[Consumer]:
    """CUDA runtimes installed as Python packages (nvidia/*/lib) or bundled with torch. From CUDA 12 the
    runtime dlopens libcuda.so.1 and asks the handle for cuGetProcAddress_v2; without it, it falls back to
    looking each entry point up by name (measured with LD_DEBUG=symbols on the emulated vCUDA pod)."""
    candidates: dict[str, str] = {}
    for entry in path:
        patterns = (os.path.join(entry, "nvidia", "*", "lib", "libcudart*.so*"),)
        patterns += (os.path.join(entry, "torch", "lib", "libcudart*.so*"),)
        for pattern in patterns:
            for library in door.glob(pattern):
                if _CUDART.match(os.path.basename(library)):
                    candidates.setdefault(os.path.realpath(library), library)
    found = []
    for library in candidates.values():
        major = int(_CUDART.match(os.path.basename(library)).group(1))  # type: ignore[union-attr]
        try:
            asks = _contains(library, PROC_ADDRESS_V2.encode() + b"\0")
        except (OSError, ValueError) as error:
            absent = isinstance(error, FileNotFoundError)
            found.append(_unreadable(library, "cuda-runtime", "handle", str(error), absent))
            continue
        found.append(
            Consumer(
                os.path.basename(library),
                "cuda-runtime",
                library,
                "handle",
                "first CUDA runtime call (torch.cuda, NCCL, cuBLAS)",
                (PROC_ADDRESS_V2,) if asks else (),
                f"CUDA runtime {major}: the file names {PROC_ADDRESS_V2}"
                if asks
                else f"CUDA runtime {major}: does not name {PROC_ADDRESS_V2}",
            )
        )
    return found


def triton_consumer(path: list[str]) -> Consumer | None:
    """Triton's NVIDIA launcher (compiled at run time from driver.c) dlsyms these on dlopen("libcuda.so.1");
    cuLaunchKernelEx on every kernel launch."""
    triton_dir = find_package_dir("triton", path)
    if triton_dir is None:
        return None
    source = os.path.join(triton_dir, "backends", "nvidia", "driver.c")
    text = door.read_text(source)
    if text is not None:
        names = tuple(dict.fromkeys(_TRITON_HANDLE_LOOKUP.findall(text)))
        evidence = 'dlsym on dlopen("libcuda.so.1") in triton/backends/nvidia/driver.c'
    else:
        names, evidence = (LAUNCH_EX,), "assumed: Triton 3 launches every kernel through cuLaunchKernelEx"
    return Consumer("triton", "triton", source, "handle", "every Triton kernel launch", names, evidence)


def cuda_python_consumer(path: list[str]) -> Consumer | None:
    """cuda-python's driver bindings (cuda.bindings.driver) resolve every entry point through
    cuGetProcAddress_v2 found with dlsym on their own libcuda.so.1 handle."""
    modules = [
        module
        for cuda_dir in find_package_dirs("cuda", path)  # a namespace package: bindings may be in any part
        for module in door.glob(os.path.join(cuda_dir, "bindings", "_internal", "driver*.so"))
    ]
    if not modules:
        return None
    try:
        asks = _contains(modules[0], PROC_ADDRESS_V2.encode())
    except (OSError, ValueError) as error:
        return _unreadable(
            modules[0], "cuda-python", "handle", str(error), isinstance(error, FileNotFoundError)
        )
    return Consumer(
        "cuda-python",
        "cuda-python",
        modules[0],
        "handle",
        "first cuda.bindings.driver call",
        (PROC_ADDRESS_V2,) if asks else (),
        f"cuda/bindings/_internal/{os.path.basename(modules[0])} names {PROC_ADDRESS_V2}"
        if asks
        else "does not name cuGetProcAddress_v2",
    )


def other_consumers(path: list[str]) -> list[Consumer]:
    """Everything but vLLM's extensions, in a stable order."""
    found = torch_consumers(path) + cudart_consumers(path)
    found += [c for c in (triton_consumer(path), cuda_python_consumer(path)) if c is not None]
    return found
