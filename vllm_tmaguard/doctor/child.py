"""What `tmaguard doctor` runs in child processes, never in its own: NVML, and for --active CUDA itself.

Started as `python -I -S -c 'import ...; main()' MODE JSON` (children.CHILD_BOOT), so nothing of the doctor's
process is inherited but the environment; JSON carries the parent's sys.path. Prints one line
`TMAGUARD-DOCTOR <json>`; a layer may print its own lines, or hang, or exit, and the parent copes with each.

Modes:
- nvml: nvml.probe_with_nvml(): NVML through the pod's own libnvidia-ml.so.1 (--active only).
- plain: which preloaded sharing layers the loader mapped into this fresh process (its /proc/self/maps);
  then cuda-python initialises CUDA through the pod's libcuda.so.1 and encodes a tensor map on a real
  allocation, as any CUDA program in the pod would.
- guarded: the guard runs first (its real activate(): overlay or shims, routing), then
  cuTensorMapEncodeTiled is bound the way vLLM's extensions bind it (the global scope, then their own NEEDED
  libcuda.so.1) and called through ctypes on a real allocation; then cuda-python once more (what Humming or
  FlashInfer get inside a vLLM process)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from .constants import RESULT_TAG

KNOWN_RESULTS = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    100: "CUDA_ERROR_NO_DEVICE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    500: "CUDA_ERROR_NOT_FOUND",
    801: "CUDA_ERROR_NOT_SUPPORTED",
    999: "CUDA_ERROR_UNKNOWN",
}
# The tensor map: FLOAT16 (6), rank 2, 256 x 256 elements, 64 x 64 box, no interleave, 128-byte swizzle (3),
# no L2 promotion, no out-of-bounds fill: valid on every TMA-capable GPU.
FLOAT16, SWIZZLE_128B = 6, 3


class Stop(Exception):
    """A step failed; its result is recorded."""


def step(result: dict[str, Any], name: str, call: Callable[[], Any]) -> Any:
    try:
        value = call()
    except Exception as error:
        result["steps"].append({"call": name, "error": f"{type(error).__name__}: {error}"})
        raise Stop() from None
    code = value[0] if isinstance(value, tuple) else value
    number = int(code)
    name_of = getattr(code, "name", None) or KNOWN_RESULTS.get(number, str(number))
    result["steps"].append({"call": name, "result": number, "name": name_of})
    if number != 0:
        raise Stop()
    return value


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("fname", ctypes.c_char_p),
        ("fbase", ctypes.c_void_p),
        ("sname", ctypes.c_char_p),
        ("saddr", ctypes.c_void_p),
    ]


def _library_of(function: Any) -> str | None:
    info = _DlInfo()
    found = ctypes.CDLL(None).dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info))
    return info.fname.decode() if found and info.fname else None


def _memory_shown(cuda: ctypes.CDLL) -> dict[str, int] | None:
    """cuMemGetInfo's free and total with a context current: what vLLM sizes itself from (a layer that
    enforces a limit shows the limit as the total)."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    try:
        code = cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    except AttributeError:
        return None
    return {"free": free.value, "total": total.value} if code == 0 else None


def binding_check() -> dict[str, Any]:
    result: dict[str, Any] = {
        "steps": [],
        "encode": None,
        "bound_from": None,
        "shim_source": None,
        "memory": None,
        "error": None,
    }
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        result["error"] = f"dlopen libcuda.so.1: {error}"
        return result

    def call(name: str, *args: Any) -> Callable[[], Any]:
        return lambda: getattr(cuda, name)(*args)

    device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    try:
        step(result, "cuInit", call("cuInit", 0))
        step(result, "cuDeviceGet", call("cuDeviceGet", ctypes.byref(device), 0))
        step(
            result,
            "cuDevicePrimaryCtxRetain",
            call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device),
        )
        step(result, "cuCtxSetCurrent", call("cuCtxSetCurrent", context))
        result["memory"] = _memory_shown(cuda)
        step(result, "cuMemAlloc_v2", call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(1 << 20)))
    except Stop:
        return result
    # As the loader binds an extension's undefined symbol: the global scope first, then its own dependencies.
    encode = getattr(ctypes.CDLL(None), "cuTensorMapEncodeTiled", None)
    encode = encode or getattr(cuda, "cuTensorMapEncodeTiled", None)
    if encode is None:
        result["error"] = "no cuTensorMapEncodeTiled in the global scope or in libcuda.so.1"
        return result
    result["bound_from"] = _library_of(encode)
    encode.restype = ctypes.c_int
    encode.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_uint32,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint32),
        ctypes.POINTER(ctypes.c_uint32),
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
    ]
    storage = (ctypes.c_ubyte * 192)()
    tensor_map = (ctypes.addressof(storage) + 63) & ~63  # CUtensorMap is 64-byte aligned
    dims, strides = (ctypes.c_uint64 * 2)(256, 256), (ctypes.c_uint64 * 1)(512)
    box, element_strides = (ctypes.c_uint32 * 2)(64, 64), (ctypes.c_uint32 * 2)(1, 1)
    arguments = (
        tensor_map,
        FLOAT16,
        2,
        pointer.value,
        dims,
        strides,
        box,
        element_strides,
        0,
        SWIZZLE_128B,
        0,
        0,
    )
    with contextlib.suppress(Stop):
        step(result, "cuTensorMapEncodeTiled", lambda: encode(*arguments))
    result["encode"] = result["steps"][-1]
    if result["bound_from"]:
        try:
            library = ctypes.CDLL(result["bound_from"], mode=os.RTLD_NOLOAD)
            source = getattr(library, "tmaguard_shim_source", None)  # the guard's shim or overlay
        except OSError:
            source = None
        if source is not None:
            source.restype = ctypes.c_int
            result["shim_source"] = source(b"cuTensorMapEncodeTiled")
    free = getattr(cuda, "cuMemFree_v2", None)
    if free is not None:
        free(pointer)
    return result


def cuda_python_check() -> dict[str, Any]:
    result: dict[str, Any] = {"available": False, "steps": [], "encode": None, "error": None}
    try:
        from cuda.bindings import __version__ as version
        from cuda.bindings import driver as d
    except Exception as error:
        result["error"] = f"{type(error).__name__}: {error}"
        return result
    result["available"], result["version"] = True, version
    u32, u64 = d.cuuint32_t, d.cuuint64_t
    try:
        step(result, "cuInit", lambda: d.cuInit(0))
        _, device = step(result, "cuDeviceGet", lambda: d.cuDeviceGet(0))
        _, context = step(result, "cuDevicePrimaryCtxRetain", lambda: d.cuDevicePrimaryCtxRetain(device))
        step(result, "cuCtxSetCurrent", lambda: d.cuCtxSetCurrent(context))
        _, pointer = step(result, "cuMemAlloc", lambda: d.cuMemAlloc(1 << 20))
    except Stop:
        return result
    arguments = (
        d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        u32(2),
        pointer,
        [u64(256), u64(256)],
        [u64(512)],
        [u32(64), u32(64)],
        [u32(1), u32(1)],
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    with contextlib.suppress(Stop):
        step(result, "cuTensorMapEncodeTiled", lambda: d.cuTensorMapEncodeTiled(*arguments))
    result["encode"] = result["steps"][-1]
    for clean_up in (lambda: d.cuMemFree(pointer), lambda: d.cuDevicePrimaryCtxRelease(device)):
        with contextlib.suppress(Exception):
            clean_up()
    return result


def preload_check() -> list[dict[str, Any]]:
    """Each preload entry of a sharing layer this process's loader was given (its LD_PRELOAD, the real
    /etc/ld.so.preload) and whether it is in /proc/self/maps: whether the layer is in force in a process
    started as the pod starts them."""
    from vllm_tmaguard import files, loaded
    from vllm_tmaguard.stages import door, layers, preloads

    from_env = preloads.split_preload(os.environ.get(preloads.PRELOAD_ENV, ""))
    text = door.read_text(preloads.PRELOAD_FILE, 1 << 20) or ""
    entries = {e: preloads.PRELOAD_ENV for e in from_env}
    for entry in preloads.preload_file_entries(text):
        entries.setdefault(entry, preloads.PRELOAD_FILE)
    try:
        maps = files.read_bytes("/proc/self/maps", noted=False).decode("utf-8", "surrogateescape")
    except OSError:
        return []
    mapped = set(loaded.mapped_files(maps))
    names = {os.path.basename(path) for path in mapped}
    return [
        {
            "entry": entry,
            "source": source,
            "layer": layer,
            "mapped": entry in mapped or os.path.basename(entry) in names or files.realpath(entry) in mapped,
        }
        for entry, source in entries.items()
        if (layer := layers.preloaded_layer(entry)) in layers.JUDGED
    ]


def run(mode: str, args: dict[str, Any]) -> dict[str, Any]:
    if mode == "nvml":
        from vllm_tmaguard.doctor.nvml import probe_with_nvml

        facts = probe_with_nvml()
        return {**facts._asdict(), "gpus": [gpu._asdict() for gpu in facts.gpus]}
    out: dict[str, Any] = {"guard": None, "binding": None, "cuda_python": None, "error": None}
    try:
        if mode == "plain":
            out["preloads"] = preload_check()
        if mode == "guarded":
            os.environ["TMAGUARD_RECORD_DIR"] = args["record_dir"]  # the pod's own last.json stays as it is
            from vllm_tmaguard.guard import activate

            record = activate("doctor-active")
            out["guard"] = (
                None
                if record is None
                else {k: record.get(k) for k in ("outcome", "summary", "actions", "problems")}
            )
            out["binding"] = binding_check()
        out["cuda_python"] = cuda_python_check()
    except BaseException as error:  # the guard's strict mode raises SystemExit
        out["error"] = f"{type(error).__name__}: {error}"
    return out


def main() -> None:
    mode, args = sys.argv[1], json.loads(sys.argv[2])
    print(RESULT_TAG + json.dumps(run(mode, args)), flush=True)
