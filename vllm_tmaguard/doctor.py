"""`tmaguard doctor`: the cause of a failing vLLM pod and the exact fix, in well under a second.

Passive by default: reads files, the environment and ELF tables through the guard's own probes (facts.py,
vllm_probe.py, consumers.py, fatbin.py); never imports torch or vLLM and never initialises CUDA in this
process. NVML is asked in a child process with a time limit (a sharing layer's NVML may hang or exit).
`--active` adds child processes that initialise CUDA through the pod's own libcuda.so.1 and encode a tensor
map on a real allocation. The report is a dict with a versioned schema (docs/doctor.md): `gather` builds it,
`render` prints it for people."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from . import __version__
from .consumers import LAUNCH_EX, PROC_ADDRESS_V2, Consumer, other_consumers, site_path, vllm_consumers
from .fatbin import FatbinError, coverage, read_fatbin, sm_name
from .gpu import Gpu, GpuFacts
from .toggles import Toggles
from .vllm_probe import extension_modules, find_package_dir

SCHEMA = "tmaguard.doctor/1"
DEFAULT_NVML_TIMEOUT = 5.0
DEFAULT_ACTIVE_TIMEOUT = 60.0
SEVERITIES = ("error", "warning", "info", "ok")  # error and warning are problems: exit status 1
_PROBLEM = frozenset({"error", "warning"})
_RESULT_TAG = "TMAGUARD-DOCTOR "  # doctor_child.RESULT_TAG (not imported: it imports ctypes)

# ---------------------------------------------------------------------------------------------------------
# NVML, in a child process

# `python -I -S -c CHILD_BOOT MODE JSON`: isolated, no site hooks; doctor_child is imported (its cached
# bytecode used) from the parent's sys.path, which the JSON carries.
CHILD_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[2])['path']; "
    "from vllm_tmaguard.doctor_child import main; main()"
)


@dataclasses.dataclass
class ChildRun:
    """One child process: started at once, collected later, so the parent's file probes overlap it."""

    process: subprocess.Popen[str]
    started: float
    timeout: float

    @classmethod
    def start(cls, mode: str, arguments: dict[str, Any], timeout: float) -> ChildRun:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", CHILD_BOOT, mode, json.dumps({"path": sys.path, **arguments})],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: a helper it forks is killed with it
        )
        return cls(process, time.perf_counter(), timeout)

    def collect(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """(the JSON the child printed, or None; how it ran)."""
        remaining = max(0.0, self.timeout - (time.perf_counter() - self.started))
        timed_out = False
        try:
            out, err = self.process.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                self.process.kill()
            try:
                out, err = self.process.communicate(timeout=2)
            except subprocess.TimeoutExpired:  # a helper left the process group and holds the pipes open
                self.process.wait()
                out, err = "", "its output pipes were held open by a process that left its process group"
        lines = [line for line in out.splitlines() if line.startswith(_RESULT_TAG)]
        result = None
        if lines:
            try:
                result = json.loads(lines[-1][len(_RESULT_TAG) :])
            except ValueError:
                result = None
        run = {
            "timeout_s": self.timeout,
            "timed_out": timed_out and result is None,
            "exit_status": None if timed_out else self.process.returncode,
            "elapsed_ms": round((time.perf_counter() - self.started) * 1e3, 1),
            "stderr_tail": err.strip()[-400:] or None,
        }
        return result, run


def start_gpu_query(timeout: float) -> ChildRun:
    return ChildRun.start("nvml", {}, timeout)


def gpu_facts_from(result: dict[str, Any] | None, run: dict[str, Any]) -> GpuFacts:
    """GpuFacts from the child's answer, or one whose error says why there is none."""
    if result is None:
        if run["timed_out"]:
            why = f"NVML did not answer within {run['timeout_s']:g} s (the query was killed)"
        else:
            why = f"the NVML query process exited with status {run['exit_status']} before answering"
            if run["stderr_tail"]:
                why += f": {run['stderr_tail'].splitlines()[-1]}"
        return GpuFacts(error=why, source="nvml (child process)")
    gpus = tuple(
        Gpu(**{**gpu, "compute_capability": tuple(gpu["compute_capability"])}) for gpu in result["gpus"]
    )
    return GpuFacts(
        gpus=gpus,
        driver_version=result.get("driver_version"),
        cuda_driver_version=result.get("cuda_driver_version"),
        error=result.get("error"),
        source="nvml (child process)",
    )


# ---------------------------------------------------------------------------------------------------------
# --active: CUDA initialised in child processes through the pod's own libcuda.so.1

SHIM_SOURCES = {
    -1: "none: no real encoder reachable, the guard answers CUDA_ERROR_NOT_SUPPORTED",
    0: "not resolved",
    1: "the layer's cuGetProcAddress_v2",
    2: "the layer's cuGetProcAddress",
    3: "the real driver file the layer opened",
    4: "the layer's own symbol",
}


def run_active(timeout: float) -> dict[str, Any]:
    """The plain and the guarded check (doctor_child.py), one child process each, one after the other."""
    import shutil
    import tempfile

    plain, plain_run = ChildRun.start("plain", {}, timeout).collect()
    record_dir = tempfile.mkdtemp(prefix="tmaguard-doctor-")
    try:
        guarded, guarded_run = ChildRun.start("guarded", {"record_dir": record_dir}, timeout).collect()
    finally:
        shutil.rmtree(record_dir, ignore_errors=True)
    binding = (guarded or {}).get("binding")
    if binding and binding.get("shim_source") is not None:
        binding["shim_source_means"] = SHIM_SOURCES.get(binding["shim_source"], "unknown")
    return {"plain": {"result": plain, "run": plain_run}, "guarded": {"result": guarded, "run": guarded_run}}


def _applies(decision: Any) -> bool:
    return bool(getattr(decision, "apply", False))


# ---------------------------------------------------------------------------------------------------------
# Gathering


def _finding(
    finding_id: str,
    severity: str,
    title: str,
    detail: str = "",
    subject: str | None = None,
    fix: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": finding_id,
        "severity": severity,
        "title": title,
        "detail": detail,
        "subject": subject,
        "fix": fix,
    }


def _fix(
    text: str,
    env: Mapping[str, str] | None = None,
    vllm_args: list[str] | None = None,
    manifest: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "text": text,
        "env": dict(env or {}),
        "vllm_args": list(vllm_args or []),
        "manifest": manifest or [],
    }


def _library_file(supply: Any) -> str | None:
    """The file the guard loads for one supply (a shim, or the overlay variant for its groups)."""
    try:
        from . import libraries
    except ImportError:  # before the overlay: the shim paths lived in actions
        from . import actions as libraries  # type: ignore[no-redef]
    if supply.library == "overlay":
        overlay_path = getattr(libraries, "overlay_path", None)
        return overlay_path(getattr(supply, "groups", frozenset())) if overlay_path else None
    return libraries.shim_path(supply.library) if supply.library in libraries.SHIM_FILES else None


def _site_dirs() -> set[str]:
    """The directories whose .pth files the interpreter runs at start-up."""
    import site

    dirs = set(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    return {os.path.realpath(d) for d in dirs}


def _guard_hooks(
    vllm_found: bool, platform_plugins: bool, environ: Mapping[str, str], supplies: tuple[Any, ...]
) -> dict[str, Any]:
    """Whether the guard runs in vLLM processes started here (its entry point, its .pth hook), and what it
    would load there."""
    package_dir = os.path.dirname(os.path.abspath(__file__))
    site = os.path.realpath(os.path.dirname(package_dir))
    entry_point = None
    try:
        infos = [n for n in os.listdir(site) if n.startswith("vllm_tmaguard-") and n.endswith(".dist-info")]
    except OSError:
        infos = []
    for info in infos:
        try:
            with open(os.path.join(site, info, "entry_points.txt")) as file:
                entry_point = "[vllm.platform_plugins]" in file.read()
        except OSError:
            continue
    plugins_filter = environ.get("VLLM_PLUGINS")
    filtered = plugins_filter is not None and "tmaguard" not in [p.strip() for p in plugins_filter.split(",")]
    pth = site in _site_dirs() and os.path.exists(os.path.join(site, "vllm_tmaguard.pth"))
    plugin_runs = bool(entry_point) and platform_plugins and not filtered
    loads = []
    for supply in supplies:
        path = _library_file(supply)
        loads.append(
            {
                "library": supply.library,
                "symbols": list(supply.symbols),
                "how": supply.how,
                "file": path,
                "file_exists": path is not None and os.path.exists(path),
            }
        )
    return {
        "version": __version__,
        "package_dir": package_dir,
        "platform_plugin": entry_point,
        "vllm_plugins": plugins_filter,
        "platform_plugin_runs": plugin_runs,
        "import_hook": pth,
        "hooked": plugin_runs or pth or not vllm_found,
        "supplies": loads,
    }


def _read_record(record_dir: str) -> dict[str, Any]:
    path = os.path.join(record_dir, "last.json")
    out: dict[str, Any] = {"path": path, "found": False, "age_s": None, "error": None, "record": None}
    try:
        with open(path) as file:
            out["record"] = json.load(file)
        out["found"] = True
        out["age_s"] = round(time.time() - os.stat(path).st_mtime, 1)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as error:
        out["error"] = f"{type(error).__name__}: {error}"
    return out


def _read_fatbins(package_dir: str | None) -> list[tuple[str, str, Any]]:
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


def _architectures(fatbins: list[tuple[str, str, Any]], capabilities: list[tuple[int, int]]) -> dict:
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


def _consumer_rows(
    consumers: list[Consumer], driver: Any, supplies: tuple[Any, ...], active: bool
) -> list[dict[str, Any]]:
    """Each consumer's needs against what libcuda.so.1 exports, and what covers each gap: "overlay" (the
    guard's overlay becomes the process's libcuda.so.1: every consumer sees it), "shim" (RTLD_GLOBAL: only
    global-scope consumers see it), "off" (the guard would, but is off or not hooked in), "none"."""
    overlay = {s for supply in supplies if supply.library == "overlay" for s in supply.symbols}
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
            }
        )
    return rows


def gather(
    environ: Mapping[str, str],
    toggles: Toggles,
    nvml_timeout: float = DEFAULT_NVML_TIMEOUT,
    vllm_dir: str | None = None,
    active: bool = False,
    active_timeout: float = DEFAULT_ACTIVE_TIMEOUT,
) -> dict[str, Any]:
    """The whole report. Never raises for what it finds: an unreadable file or a hanging NVML is a finding."""
    started = time.perf_counter()
    nvml = start_gpu_query(nvml_timeout)  # runs while the file probes below do their work

    from .actions import Outcome
    from .decision import decide
    from .facts import probe
    from .record import build_record

    path = site_path(vllm_dir, sys.path)
    package_dir = vllm_dir or find_package_dir("vllm")
    others = other_consumers(path)
    fatbins = _read_fatbins(package_dir)
    record = _read_record(toggles.record_dir)
    gpu_result, gpu_run = nvml.collect()
    gpu = gpu_facts_from(gpu_result, gpu_run)
    facts = probe(environ, toggles.root, "doctor", gpu=gpu, vllm_dir=package_dir)
    decision = decide(facts, toggles)
    architectures = _architectures(fatbins, sorted(gpu.capabilities()))
    supplies = tuple(getattr(decision, "supplies", ()))
    hooks = _guard_hooks(facts.vllm.found, facts.vllm.platform_plugins, environ, supplies)
    active_guard = _applies(decision) and hooks["hooked"]
    consumers = _consumer_rows(vllm_consumers(facts.vllm) + others, facts.driver, supplies, active_guard)
    view = build_record(facts, dataclasses.replace(decision, apply=False), Outcome(), toggles.mode, 0.0)
    view.pop("elapsed_ms", None)
    driver = facts.driver
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "tmaguard": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "active": active,
        "status": None,
        "exit_code": None,
        "elapsed_ms": None,
        "python": {"executable": sys.executable, "version": sys.version.split()[0]},
        "toggles": dataclasses.asdict(toggles),
        "gpu": {
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "compute_capability": "{}.{}".format(*g.compute_capability),
                    "sm": sm_name(g.compute_capability),
                    "mig": g.mig,
                    "virtualization": g.virtualization,
                }
                for g in gpu.gpus
            ],
            "driver_version": gpu.driver_version,
            "cuda_driver_version": gpu.cuda_driver_version,
            "error": gpu.error,
            "query": {"how": "NVML in a child process", **gpu_run},
        },
        "layers": [
            {
                "name": layer.name,
                "evidence": list(layer.evidence),
                "forwards_to_local_driver": layer.forwards_to_local_driver,
            }
            for layer in facts.layers
        ],
        "libcuda": {
            "path": driver.path,
            "realpath": os.path.realpath(driver.path) if driver.path else None,
            "how": driver.resolution.how,
            "soname": driver.info.soname if driver.info else None,
            "exports": len(driver.info.defined) if driver.info else None,
            "skipped": list(driver.resolution.skipped),
            "mapped": list(driver.resolution.mapped),
            "real_driver": driver.real_driver,
            "overlay_of": getattr(driver, "overlay_of", None),
            "error": driver.error,
        },
        "vllm": {
            "found": facts.vllm.found,
            "version": facts.vllm.version,
            "package_dir": facts.vllm.package_dir,
            "platform_plugins": facts.vllm.platform_plugins,
            "imported_at_platform_load": list(facts.vllm.imported_at_platform_load),
        },
        "consumers": consumers,
        "architectures": architectures,
        "guard": hooks,
        "decision": view,
        "record": record,
        "active_check": run_active(active_timeout) if active else None,
    }
    report["findings"] = diagnose(report)
    problems = [f for f in report["findings"] if f["severity"] in _PROBLEM]
    report["status"] = "problems" if problems else "healthy"
    report["exit_code"] = 1 if problems else 0
    report["fix"] = merged_fix(report["findings"])
    report["elapsed_ms"] = round((time.perf_counter() - started) * 1e3, 1)
    return report


# ---------------------------------------------------------------------------------------------------------
# Findings: a pure function of the gathered report

_HANDLE_EFFECTS = {
    ("triton", LAUNCH_EX): ("error", "every Triton kernel launch fails"),
    ("triton", "cuTensorMapEncodeTiled"): ("warning", "Triton kernels with host-side TMA descriptors fail"),
    ("triton", "cuTensorMapEncodeIm2col"): ("warning", "Triton kernels with host-side TMA descriptors fail"),
    ("triton", "cuOccupancyMaxActiveClusters"): (
        "info",
        "Triton's cluster occupancy query fails (rarely used)",
    ),
    ("cuda-runtime", PROC_ADDRESS_V2): (
        "warning",
        "the CUDA runtime falls back to looking each entry point up by name; cudaGetDriverEntryPoint "
        "cannot reach what the layer lacks (e.g. the tensor-map encoders for torch's CUTLASS kernels)",
    ),
    ("cuda-python", PROC_ADDRESS_V2): (
        "warning",
        "cuda.bindings.driver cannot initialise (RuntimeError: Failed to get cuGetProcAddress_v2)",
    ),
}
_OVERLAY = "needs the overlay (not available in this version)"
_EFFECT = {
    "vllm-extension": ("error", "vLLM fails to import it"),
    "torch-library": ("warning", "torch fails to load it"),
    "cuda-runtime": ("warning", "the CUDA runtime cannot reach it"),
    "triton": ("error", "Triton cannot launch"),
    "cuda-python": ("warning", "cuda-python cannot use it"),
}


def _gpu_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    gpu = report["gpu"]
    query = gpu["query"]
    findings = []
    if query["timed_out"]:
        findings.append(
            _finding(
                "nvml-timeout",
                "error",
                f"NVML did not answer within {query['timeout_s']:g} s",
                "The NVML query (in a child process) hung and was killed. vLLM detects CUDA through NVML at "
                "start-up, so it hangs the same way.",
                fix=_fix(
                    "Check the sharing layer's NVML and the daemon or socket it talks to (vCUDA: "
                    "/etc/vcuda/vcuda.sock); rerun with --nvml-timeout SECONDS to wait longer."
                ),
            )
        )
    elif gpu["error"]:
        crashed = query["exit_status"] not in (0, None)
        findings.append(
            _finding(
                "nvml-crashed" if crashed else "nvml-error",
                "error",
                "NVML query crashed" if crashed else "NVML cannot report the GPUs",
                f"{gpu['error']}. vLLM detects CUDA through NVML: without it vLLM does not use the GPU.",
                fix=_fix(
                    "Mount the driver's libnvidia-ml.so.1 (NVIDIA container toolkit, "
                    "NVIDIA_DRIVER_CAPABILITIES=compute,utility) or fix the sharing layer's NVML."
                ),
            )
        )
    elif not gpu["gpus"]:
        findings.append(
            _finding(
                "no-gpu",
                "error",
                "No NVIDIA GPU visible",
                "NVML reports 0 devices: vLLM will not find a CUDA platform.",
                fix=_fix(
                    "Request a GPU for the container.",
                    manifest=["resources:", "  limits:", "    nvidia.com/gpu: 1"],
                ),
            )
        )
    for g in gpu["gpus"]:
        if g["mig"]:
            findings.append(
                _finding(
                    "mig",
                    "info",
                    f"GPU {g['index']} is in MIG mode",
                    "Each MIG instance is its own CUDA device; address it by its MIG UUID.",
                    subject=str(g["index"]),
                )
            )
        if g["virtualization"] not in (None, "none"):
            findings.append(
                _finding(
                    "virtualization",
                    "info",
                    f"GPU {g['index']} virtualization mode: {g['virtualization']}",
                    "An NVIDIA vGPU guest or pass-through: the driver inside is NVIDIA's.",
                    subject=str(g["index"]),
                )
            )
    return findings


def _libcuda_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    libcuda = report["libcuda"]
    if libcuda["path"] is None:
        skipped = "; ".join(libcuda["skipped"])
        return [
            _finding(
                "libcuda-missing",
                "error",
                "No usable libcuda.so.1",
                "The loader finds no libcuda.so.1"
                + (f" it can load (passed over: {skipped})" if skipped else "")
                + ": vLLM's CUDA extensions cannot load.",
                fix=_fix(
                    "Mount the NVIDIA driver into the container (NVIDIA container toolkit, runtimeClassName: "
                    "nvidia) or put the directory holding libcuda.so.1 on LD_LIBRARY_PATH."
                ),
            )
        ]
    if libcuda["error"]:
        return [
            _finding(
                "libcuda-unreadable",
                "error",
                "libcuda.so.1 cannot be read",
                f"{libcuda['path']}: {libcuda['error']}. What it exports cannot be checked, and the loader "
                "will fail on it too.",
                fix=_fix("Replace the damaged file (reinstall the driver or the sharing layer)."),
            )
        ]
    return []


def _layer_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    findings = []
    exports = {row["name"]: row for row in report["consumers"]}
    vmm = exports.get("vllm.cumem_allocator")
    for layer in report["layers"]:
        name = layer["name"]
        findings.append(
            _finding(
                "layer",
                "info",
                f"GPU-sharing layer: {name}",
                "; ".join(layer["evidence"]),
                subject=name,
            )
        )
        if name == "hami":
            findings.append(
                _finding(
                    "known-hami-tensor-parallel",
                    "info",
                    "HAMi-core with tensor parallel > 1",
                    "NCCL, cuMemCreate (VMM) and CUDA IPC are known to misbehave under HAMi-core's "
                    "interception when vLLM runs several GPU workers: hangs or failures in vLLM's custom "
                    "all-reduce.",
                    subject=name,
                    fix=_fix(
                        "With --tensor-parallel-size > 1, turn vLLM's custom all-reduce off.",
                        vllm_args=["--disable-custom-all-reduce"],
                    ),
                )
            )
        elif name == "lupine":
            findings.append(
                _finding(
                    "known-lupine-no-local-driver",
                    "info",
                    "lupine: no local driver behind the layer",
                    "The GPU is reached over the network, so an entry point the layer lacks cannot be "
                    "forwarded to a local driver: the guard's encoders answer CUDA_ERROR_NOT_SUPPORTED and "
                    "vLLM's TMA kernels must be routed away (the guard does so).",
                    subject=name,
                )
            )
        elif name.startswith("vcuda") and vmm is not None and vmm["lacks"]:
            findings.append(
                _finding(
                    "known-vcuda-sleep-mode",
                    "info",
                    "vCUDA without the VMM entry points: sleep mode fails",
                    f"This libcuda.so.1 lacks {', '.join(vmm['lacks'])}; vLLM's sleep mode "
                    "(--enable-sleep-mode, the CuMem allocator) needs them.",
                    subject=name,
                    fix=_fix("Do not pass --enable-sleep-mode on this pod."),
                )
            )
    return findings


def _gap_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    findings = []
    toggles = report["toggles"]
    hooked = report["guard"]["hooked"]
    unfixed = report["decision"].get("unfixed") or []
    overlay_shipped = _overlay_shipped()
    by_symbol: dict[tuple[str, str], list[dict[str, Any]]] = {}
    handle_gaps = []
    for row in report["consumers"]:
        if row["error"]:
            findings.append(
                _finding(
                    "consumer-unreadable",
                    "error" if row["kind"] == "vllm-extension" else "warning",
                    f"{row['name']} cannot be read",
                    f"{row['path']}: {row['error']}. The loader will fail on it too.",
                    subject=row["name"],
                    fix=_fix("Reinstall the package that ships it."),
                )
            )
            continue
        for symbol, cover in row["coverage"].items():
            if cover == "none" and row["scope"] == "handle":
                continue
            by_symbol.setdefault((symbol, cover), []).append(row)
        lacking = [s for s, cover in row["coverage"].items() if cover == "none" and row["scope"] == "handle"]
        if lacking:
            handle_gaps.append((row, lacking))

    all_handle = sorted({s for _, lacking in handle_gaps for s in lacking})
    vcuda = any(layer["name"].startswith("vcuda") for layer in report["layers"])
    fork_has = {PROC_ADDRESS_V2, "cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col"}  # DESIGN.md §2.9
    layer_build = f"use a build of the sharing layer whose libcuda.so.1 exports {', '.join(all_handle)}" + (
        " (vCUDA forks do)" if vcuda and set(all_handle) <= fork_has else ""
    )
    for row, lacking in handle_gaps:
        effects = sorted(
            (_HANDLE_EFFECTS.get((row["kind"], s), ("warning", f"{s} cannot be used")) for s in lacking),
            key=lambda effect: SEVERITIES.index(effect[0]),
        )
        consequences = "; ".join(dict.fromkeys(e[1] for e in effects))
        blockers = [u for u in unfixed if any(s in u for s in lacking)]
        if not overlay_shipped:
            why, fix = f"{_OVERLAY}.", _fix(f"{_OVERLAY.capitalize()}; until then, {layer_build}.")
        elif toggles.get("overlay") == "off":
            why = "TMAGUARD_OVERLAY=off keeps the guard's overlay out."
            fix = _fix("Let the guard load its overlay.", env={"TMAGUARD_OVERLAY": "auto"})
        elif blockers:
            why, fix = " ".join(blockers) + ".", _fix(f"See `tmaguard env`; or {layer_build}.")
        else:
            why, fix = (
                "the guard's overlay does not carry it.",
                _fix(f"{layer_build[0].upper()}{layer_build[1:]}."),
            )
        findings.append(
            _finding(
                "gap-handle-unfixed",
                effects[0][0],
                f"{row['name']}: libcuda.so.1 lacks {', '.join(lacking)}",
                f"{consequences[0].upper()}{consequences[1:]}. {row['name']} asks its own "
                f'dlopen("libcuda.so.1") handle ({row["evidence"]}), which an RTLD_GLOBAL shim cannot '
                f"reach: {why}",
                subject=row["name"],
                fix=fix,
            )
        )

    for (symbol, cover), rows in sorted(by_symbol.items()):
        names = ", ".join(row["name"] for row in rows)
        if cover in ("shim", "overlay"):
            how = (
                "the guard's overlay (the process's libcuda.so.1: the layer plus what it lacks)"
                if cover == "overlay"
                else "the guard's RTLD_GLOBAL shim"
            )
            findings.append(
                _finding(
                    "gap-supplied",
                    "ok",
                    f"{symbol}: missing from libcuda.so.1, supplied by the guard ({cover})",
                    f"Needed by {names}; supplied by {how} before vLLM imports its extensions.",
                    subject=symbol,
                )
            )
        elif cover == "off":
            mode = toggles["mode"]
            why = f"TMAGUARD_MODE={mode}" if mode != "auto" else "the guard is not hooked into vLLM"
            fix = (
                _fix("Let the guard supply it.", env={"TMAGUARD_MODE": "auto"})
                if mode != "auto" or hooked
                else _fix("Reinstall vllm-tmaguard into vLLM's Python environment.")
            )
            effects = sorted({_EFFECT.get(r["kind"], ("warning", "it fails"))[1] for r in rows})
            findings.append(
                _finding(
                    "gap-guard-off",
                    "error",
                    f"{symbol}: missing from libcuda.so.1, and the guard will not supply it ({why})",
                    f"Needed by {names}: {'; '.join(effects)}.",
                    subject=symbol,
                    fix=fix,
                )
            )
        else:
            severity = "error" if any(r["kind"] == "vllm-extension" for r in rows) else "warning"
            effects = sorted({_EFFECT.get(r["kind"], ("warning", "it fails"))[1] for r in rows})
            findings.append(
                _finding(
                    "gap-unfixed",
                    severity,
                    f"{symbol}: missing from libcuda.so.1, and nothing supplies it",
                    f"Needed by {names}: {'; '.join(effects)} where it is used. The guard forwards only "
                    "entry points no sharing layer meters; this one would bypass the layer's quota.",
                    subject=symbol,
                    fix=_fix(f"Use a build of the sharing layer that exports {symbol}."),
                )
            )
    return findings


def _overlay_shipped() -> bool:
    """Whether this version of the package has the overlay (DESIGN.md §2.5)."""
    from . import decision

    return hasattr(decision, "OVERLAY_GROUPS")


def _arch_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    findings = []
    core = set(report["vllm"]["imported_at_platform_load"])
    missing: dict[str, list[str]] = {}
    jit_only: dict[str, list[str]] = {}
    for extension in report["architectures"]["extensions"]:
        module = extension["module"]
        if extension["error"]:
            if not any(row["name"] == module and row["error"] for row in report["consumers"]):
                findings.append(
                    _finding(
                        "fatbin-unreadable",
                        "warning",
                        f"{module}: its GPU code cannot be read",
                        f"{extension['path']}: {extension['error']}",
                        subject=module,
                        fix=_fix("Reinstall vLLM."),
                    )
                )
            continue
        for sm, result in extension["coverage"].items():
            carried = ", ".join(extension["sass"] + extension["ptx"])
            if result["verdict"] == "none":
                if module in core:
                    findings.append(
                        _finding(
                            "arch-missing",
                            "error",
                            f"{module} has no {sm} code",
                            f"It carries {carried}: none of it runs on this GPU, and vLLM imports it at "
                            "start-up.",
                            subject=module,
                            fix=_fix(f"Install a vLLM build compiled for {sm} (TORCH_CUDA_ARCH_LIST)."),
                        )
                    )
                else:
                    missing.setdefault(sm, []).append(f"{module} ({carried})")
            elif result["verdict"] == "jit":
                if module in core:
                    findings.append(
                        _finding(
                            "arch-jit-only",
                            "warning",
                            f"{module} has no {sm} SASS, only PTX",
                            f"The driver JIT-compiles its kernels ({', '.join(extension['ptx'])}) on first "
                            "use: "
                            "slow start, and the compiled cache is lost with the pod.",
                            subject=module,
                            fix=_fix(f"Install a vLLM build compiled for {sm} (TORCH_CUDA_ARCH_LIST)."),
                        )
                    )
                else:
                    jit_only.setdefault(sm, []).append(f"{module} ({', '.join(extension['ptx'])})")
    for sm in report["architectures"]["devices"]:
        parts = []
        if missing.get(sm):
            parts.append(
                f"no {sm} code in {'; '.join(missing[sm])}: vLLM selects these kernels only on the GPUs "
                "they were built for (sm_90a code runs on 9.0 only, sm_100f on 10.x)"
            )
        if jit_only.get(sm):
            parts.append(f"PTX only (JIT-compiled on first use) in {'; '.join(jit_only[sm])}")
        if parts:
            findings.append(
                _finding(
                    "arch-coverage",
                    "info",
                    f"GPU code for {sm}: not every extension has it",
                    ". ".join(parts) + ".",
                    subject=sm,
                )
            )
    return findings


def _decision_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    findings = []
    view = report["decision"]
    tma = view.get("tma")
    sm90 = any(g["compute_capability"].startswith("9.") for g in report["gpu"]["gpus"])
    if tma and sm90:
        findings.append(
            _finding(
                "tma",
                "ok" if tma["usable"] else "info",
                "TMA usable on sm_90"
                if tma["usable"]
                else "TMA unusable on sm_90: the guard routes vLLM's TMA kernels away",
                tma["reason"],
            )
        )
    routing = view.get("routing") or {}
    if routing.get("error"):
        findings.append(
            _finding(
                "routing-error",
                "error",
                "The requested kernel routing cannot be had",
                routing["error"],
                fix=_fix("Set TMAGUARD_GEMM=auto.", env={"TMAGUARD_GEMM": "auto"}),
            )
        )
    for override in routing.get("overrides", []):
        findings.append(
            _finding("routing-override", "warning", "The guard overrides one of your settings", override)
        )
    for hint in routing.get("hints", []):
        findings.append(
            _finding(
                "routing-no-knob", "warning", "A TMA path no environment knob reaches", hint, fix=_fix(hint)
            )
        )
    return findings


def _guard_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    findings = []
    guard = report["guard"]
    supplies = [supply["library"] for supply in guard["supplies"]]
    if supplies and not guard["hooked"]:
        findings.append(
            _finding(
                "guard-not-hooked",
                "error",
                "The guard does not run in vLLM processes started here",
                f"No platform-plugin entry point runs (VLLM_PLUGINS={guard['vllm_plugins']!r}) and the .pth "
                "import hook is missing.",
                fix=_fix("Add tmaguard to VLLM_PLUGINS, or reinstall vllm-tmaguard into vLLM's environment."),
            )
        )
    for supply in guard["supplies"]:
        if not supply["file_exists"]:
            findings.append(
                _finding(
                    "library-missing",
                    "error",
                    f"The guard's {supply['library']} library is missing",
                    f"{supply['file']}: vllm-tmaguard was installed without its compiled libraries.",
                    subject=supply["library"],
                    fix=_fix("Reinstall vllm-tmaguard from a wheel (or with a C compiler present)."),
                )
            )
    record = report["record"]
    if record["error"]:
        findings.append(
            _finding(
                "record-unreadable",
                "warning",
                "The guard's last record cannot be read",
                f"{record['path']}: {record['error']}",
            )
        )
    elif not record["found"]:
        findings.append(
            _finding(
                "record-missing",
                "info",
                "No record from the guard yet",
                f"No {record['path']}: vLLM has not started here with the guard, or wrote its record "
                "elsewhere "
                "(TMAGUARD_RECORD_DIR must be the same for vLLM and the doctor; an init or debug container "
                "has its own /tmp).",
            )
        )
    else:
        last = record["record"]
        failed = last.get("failed") or []
        written_with = (last.get("libcuda") or {}).get("path")
        elsewhere = (
            f" It was written with another libcuda.so.1 ({written_with}): perhaps by another container."
            if written_with != report["libcuda"]["path"]
            else ""
        )
        findings.append(
            _finding(
                "record",
                "warning" if failed else "info",
                f"The guard's last record ({last.get('trigger')}, pid {last.get('pid')}, {last.get('time')})",
                (f"Failed: {'; '.join(failed)}. " if failed else "") + f"{last.get('summary')}.{elsewhere}",
            )
        )
    return findings


def _vllm_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    if report["vllm"]["found"]:
        return []
    return [
        _finding(
            "vllm-missing",
            "error",
            "vLLM is not installed for this Python",
            f"No vllm package on {report['python']['executable']}'s sys.path: its extensions, architectures "
            "and kernel routing cannot be checked.",
            fix=_fix(
                "Run the doctor with vLLM's Python, or point it at vLLM: tmaguard doctor --vllm-dir DIR."
            ),
        )
    ]


def _step_failure(result: dict[str, Any]) -> str:
    failed = next((step for step in result["steps"] if step.get("error") or step.get("result")), None)
    if failed is None:
        return result.get("error") or "no result"
    return f"{failed['call']}: " + (failed.get("error") or f"returned {failed['result']} ({failed['name']})")


def _encode_finding(key: str, label: str, result: dict[str, Any], newer: bool) -> dict[str, Any] | None:
    encode = result.get("encode")
    means = result.get("shim_source_means")
    where = f" Bound from {result['bound_from']}" if result.get("bound_from") else ""
    where += (f", reached through {means}." if means else ".") if where else ""
    if encode and encode.get("result") == 0:
        return _finding(
            "active-encode-ok",
            "ok",
            f"{label}: cuTensorMapEncodeTiled returned 0 (CUDA_SUCCESS) on a real allocation",
            where.strip(),
            subject=key,
        )
    if encode:
        return _finding(
            "active-encode-failed",
            "error" if newer else "info",
            f"{label}: cuTensorMapEncodeTiled returned {encode.get('result')} "
            f"({encode.get('name') or encode.get('error')})",
            "TMA kernels would fail" + ("." if newer else " (none runs below sm_90).") + where,
            subject=key,
        )
    return None


def _active_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    active = report["active_check"]
    if active is None:
        return []
    findings = []
    newer = any(int(g["compute_capability"].split(".")[0]) >= 9 for g in report["gpu"]["gpus"])
    for key in ("guarded", "plain"):
        result, run = active[key]["result"], active[key]["run"]
        if result is None or result.get("error"):
            why = (
                "timed out"
                if run["timed_out"]
                else result["error"]
                if result
                else f"exited with status {run['exit_status']}"
            )
            findings.append(
                _finding(
                    "active-crashed",
                    "error",
                    f"Active check ({key}) {why}",
                    run["stderr_tail"] or "",
                    subject=key,
                )
            )
            continue
        if key == "guarded":
            guard = result.get("guard")
            if guard and guard.get("failed"):
                findings.append(
                    _finding(
                        "active-guard-failed",
                        "error",
                        "The guard's actions failed in a fresh process",
                        "; ".join(guard["failed"]),
                        subject=key,
                    )
                )
            binding = result["binding"]
            found = _encode_finding(key, "vLLM's binding, after the guard", binding, newer)
            findings.append(
                found
                or _finding(
                    "active-init-failed",
                    "error",
                    "CUDA does not initialise through libcuda.so.1 (after the guard)",
                    _step_failure(binding),
                    subject=key,
                )
            )
        cuda_python = result["cuda_python"]
        label = (
            "cuda-python in a vLLM process (after the guard)" if key == "guarded" else "cuda-python, plain"
        )
        if not cuda_python["available"]:
            if key == "plain":
                findings.append(
                    _finding(
                        "active-cuda-python-missing",
                        "info",
                        "cuda-python is not installed: its check did not run",
                        cuda_python["error"] or "",
                        subject=key,
                        fix=_fix("pip install 'vllm-tmaguard[active]'"),
                    )
                )
            continue
        found = _encode_finding(f"{key}-cuda-python", label, cuda_python, newer)
        if found is None:
            guarded_ok = ((active["guarded"]["result"] or {}).get("cuda_python") or {}).get("encode") or {}
            severity = "warning" if key == "guarded" or guarded_ok.get("result") != 0 else "info"
            found = _finding(
                "active-cuda-python-failed",
                severity,
                f"{label}: fails before the encode",
                _step_failure(cuda_python)
                + (" (inside vLLM processes the guard fixes this)" if severity == "info" else ""),
                subject=f"{key}-cuda-python",
            )
        findings.append(found)
    return findings


def diagnose(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every finding, most severe first (stable within a severity)."""
    findings = (
        _gpu_findings(report)
        + _libcuda_findings(report)
        + _vllm_findings(report)
        + _layer_findings(report)
        + _gap_findings(report)
        + _decision_findings(report)
        + _arch_findings(report)
        + _guard_findings(report)
        + _active_findings(report)
    )
    return sorted(findings, key=lambda f: SEVERITIES.index(f["severity"]))


def merged_fix(findings: list[dict[str, Any]]) -> dict[str, Any]:
    """The fixes of every problem, merged: steps to take, variables to set, vLLM flags, manifest lines."""
    steps, env, args, manifest = [], {}, [], []
    for finding in findings:
        fix = finding["fix"]
        if finding["severity"] not in _PROBLEM or not fix:
            continue
        if fix["text"] not in steps:
            steps.append(fix["text"])
        env.update(fix["env"])
        args += [a for a in fix["vllm_args"] if a not in args]
        manifest += [line for line in fix["manifest"] if line not in manifest]
    if env:
        manifest += ["env:"] + [f"  - name: {k}\n    value: {json.dumps(v)}" for k, v in env.items()]
    if args:
        manifest += [f"args: {json.dumps(args)}  # added to vLLM's arguments"]
    return {"steps": steps, "env": env, "vllm_args": args, "manifest": "\n".join(manifest)}


# ---------------------------------------------------------------------------------------------------------
# Readable output


def render(report: dict[str, Any], file: Any = None) -> None:
    """The report for people (rich); colours only on a terminal, 100 columns when not on one."""
    from rich import box
    from rich.console import Console, Group
    from rich.table import Table
    from rich.text import Text

    console = Console(file=file or sys.stdout, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 100
    style = {"error": "bold red", "warning": "yellow", "info": "cyan", "ok": "green"}

    def grid(label_width: int) -> Table:
        table = Table.grid(padding=(0, 2))
        table.add_column(no_wrap=True, width=label_width, style="bold")
        table.add_column(overflow="fold", ratio=1)
        return table

    def section(title: str) -> None:
        console.print()
        console.print(Text(title, style="bold underline"))

    how = (
        "active: CUDA initialised in child processes"
        if report["active"]
        else "passive: no torch or vLLM import, no CUDA context; NVML asked in a child process"
    )
    console.print(Text(f"tmaguard doctor {report['tmaguard']} ({how})", style="bold"))
    console.print()

    facts = grid(12)
    gpu = report["gpu"]
    for g in gpu["gpus"]:
        mig = {True: "MIG on", False: "MIG off", None: "MIG n/a"}[g["mig"]]
        facts.add_row(
            f"GPU {g['index']}",
            f"{g['name']}, {g['compute_capability']} ({g['sm']}), {mig}, "
            f"virtualization {g['virtualization'] or 'n/a'}",
        )
    if gpu["gpus"]:
        cuda = gpu["cuda_driver_version"]
        cuda_text = f" (CUDA {cuda // 1000}.{cuda % 1000 // 10})" if cuda else ""
        facts.add_row("Driver", f"{gpu['driver_version']}{cuda_text}")
    else:
        facts.add_row("GPU", gpu["error"] or "none (NVML: 0 devices)")
    for layer in report["layers"]:
        facts.add_row("Layer", f"{layer['name']} ({'; '.join(layer['evidence'])})")
    if not report["layers"]:
        facts.add_row("Layer", "none detected")
    libcuda = report["libcuda"]
    if libcuda["path"]:
        line = f"{libcuda['path']} (via {libcuda['how']}), SONAME {libcuda['soname']}"
        if libcuda["overlay_of"]:
            line += f"; the guard's overlay in front of {libcuda['overlay_of']}"
        if libcuda["real_driver"]:
            line += f"; real driver beside it: {libcuda['real_driver']}"
        if libcuda["error"]:
            line += f"; unreadable: {libcuda['error']}"
        facts.add_row("libcuda.so.1", line)
    else:
        skipped = f" (passed over: {'; '.join(libcuda['skipped'])})" if libcuda["skipped"] else ""
        facts.add_row("libcuda.so.1", "not found" + skipped)
    vllm = report["vllm"]
    facts.add_row("vLLM", f"{vllm['version']} at {vllm['package_dir']}" if vllm["found"] else "not found")
    guard = report["guard"]
    hooks = [
        name
        for name, on in (
            ("platform plugin", guard["platform_plugin_runs"]),
            (".pth hook", guard["import_hook"]),
        )
        if on
    ]
    facts.add_row(
        "Guard",
        f"{guard['version']}, TMAGUARD_MODE={report['toggles']['mode']}, runs through "
        f"{' and '.join(hooks) or 'nothing'}: {report['decision'].get('summary')}",
    )
    record = report["record"]
    if record["found"]:
        last = record["record"]
        facts.add_row("Last record", f"{record['path']}: {last.get('time')}, {last.get('summary')}")
    else:
        facts.add_row(
            "Last record", f"none at {record['path']}" + (f" ({record['error']})" if record["error"] else "")
        )
    console.print(facts)

    known = report["libcuda"]["path"] is not None and not report["libcuda"]["error"]
    rows = [r for r in report["consumers"] if (r["needs"] and known) or r["error"]]
    if rows:
        section("Driver entry points by consumer")
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        table.add_column("consumer", no_wrap=True)
        table.add_column("asks", overflow="fold", ratio=2)
        table.add_column("libcuda.so.1 lacks", overflow="fold", ratio=4)
        table.add_column("covered by", overflow="fold", ratio=2)
        for r in rows:
            asks = "its own handle" if r["scope"] == "handle" else "global scope"
            if r["error"]:
                table.add_row(r["name"], asks, Text(f"unreadable: {r['error']}", style="red"), "")
                continue
            lacks = "?" if r["lacks"] is None else ", ".join(r["lacks"]) or "-"
            cover = ", ".join(sorted(set(r["coverage"].values()))) or "-"
            table.add_row(r["name"], asks, lacks, cover)
        console.print(table)

    architectures = report["architectures"]
    if architectures["extensions"]:
        devices = architectures["devices"]
        section("GPU code in vLLM's extensions")
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        table.add_column("extension", no_wrap=True)
        table.add_column("SASS", overflow="fold", ratio=4)
        table.add_column("PTX", overflow="fold", ratio=3)
        for sm in devices:
            table.add_column(f"on {sm}", overflow="fold", ratio=3)
        for e in architectures["extensions"]:
            if e["error"]:
                table.add_row(
                    e["module"], Text(f"unreadable: {e['error']}", style="red"), "", *["" for _ in devices]
                )
                continue
            cells = []
            for sm in devices:
                c = e["coverage"][sm]
                if c["verdict"] == "partial":
                    cells.append(
                        f"native in {c['native']} of {e['fatbins']}"
                        + (f", JIT {c['jit']}" if c["jit"] else "")
                    )
                else:
                    cells.append({"jit": "PTX JIT only", "none": "none"}.get(c["verdict"], c["verdict"]))
            table.add_row(e["module"], " ".join(e["sass"]) or "-", " ".join(e["ptx"]) or "-", *cells)
        console.print(table)

    routing = report["decision"].get("routing") or {}
    if routing.get("families"):
        section("Kernel routing (what the guard sets in vLLM processes)")
        plan = grid(22)
        for family in routing["families"]:
            plan.add_row(family["family"], f"{family['path']} ({family['why']})")
        for key, value in (routing.get("env") or {}).items():
            plan.add_row("sets", f"{key}={value}")
        console.print(plan)

    section("Findings")
    findings = Table.grid(padding=(0, 2))
    findings.add_column(no_wrap=True, width=7)
    findings.add_column(overflow="fold", ratio=1)
    shown: set[str] = set()
    for finding in report["findings"]:
        body = [Text(finding["title"], style="bold")]
        if finding["detail"]:
            body.append(Text(finding["detail"]))
        if finding["fix"] and finding["fix"]["text"]:
            text = finding["fix"]["text"]
            body.append(Text("fix: " + (text if text not in shown else "as above"), style="italic"))
            shown.add(text)
        findings.add_row(Text(finding["severity"].upper(), style=style[finding["severity"]]), Group(*body))
    console.print(findings)

    fix = report["fix"]
    if fix["steps"] or fix["manifest"]:
        section("Fix")
        steps = Table.grid(padding=(0, 1))
        steps.add_column(no_wrap=True)
        steps.add_column(overflow="fold", ratio=1)
        for number, step in enumerate(fix["steps"], 1):
            steps.add_row(f"{number}.", step)
        console.print(steps)
        if fix["manifest"]:
            console.print("In the container spec:")
            for line in fix["manifest"].splitlines():
                console.print("  " + line, overflow="fold")
    problems = sum(f["severity"] in _PROBLEM for f in report["findings"])
    console.print()
    summary = "healthy" if not problems else f"{problems} problem{'s' if problems > 1 else ''} found"
    console.print(
        Text(
            f"{summary} (exit {report['exit_code']}), {report['elapsed_ms']} ms",
            style="bold green" if not problems else "bold red",
        )
    )


# ---------------------------------------------------------------------------------------------------------
# Command line (argparse: typer and the pydantic it imports would cost ~150 ms; see __main__.py)


def _seconds(minimum: float):  # type: ignore[no-untyped-def]
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"{text} is too small: at least {minimum:g} seconds")
        return value

    return parse


def _directory(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return os.path.abspath(text)


def parser() -> argparse.ArgumentParser:
    command = argparse.ArgumentParser(
        prog="tmaguard doctor",
        description="Why vLLM fails (or would fail) on this pod, and the exact fix. Passive by default: no "
        "torch or vLLM import, no CUDA context in this process; NVML is asked in a child process.",
        epilog="Exit status: 0 healthy, 1 problems found, 2 usage error (a bad option or TMAGUARD_* value).",
    )
    command.add_argument(
        "--json", dest="as_json", action="store_true", help=f"print the report as JSON ({SCHEMA})"
    )
    command.add_argument(
        "--active",
        action="store_true",
        help="also initialise CUDA in child processes through this pod's libcuda.so.1 and encode a tensor "
        "map on a real allocation (cuda-python, and vLLM's own binding after the guard)",
    )
    command.add_argument(
        "--nvml-timeout",
        type=_seconds(0.1),
        default=DEFAULT_NVML_TIMEOUT,
        metavar="SECONDS",
        help=f"how long the NVML child process may take (default {DEFAULT_NVML_TIMEOUT:g})",
    )
    command.add_argument(
        "--active-timeout",
        type=_seconds(1.0),
        default=DEFAULT_ACTIVE_TIMEOUT,
        metavar="SECONDS",
        help=f"how long each --active child process may take (default {DEFAULT_ACTIVE_TIMEOUT:g})",
    )
    command.add_argument(
        "--vllm-dir",
        type=_directory,
        metavar="DIR",
        help="the vllm package directory to inspect (default: the one this Python would import); torch, "
        "Triton and the CUDA runtime are then looked for beside it first",
    )
    return command


def main(argv: list[str]) -> int:
    """`tmaguard doctor ARGS`; returns the exit status."""
    from .toggles import ToggleError, parse_toggles
    from .trust import redact

    args = parser().parse_args(argv)  # exits 2 on a usage error
    try:
        toggles = parse_toggles(os.environ)
    except ToggleError as error:
        print(f"tmaguard doctor: error: {error}", file=sys.stderr)
        return 2
    try:
        report = gather(
            os.environ,
            toggles,
            nvml_timeout=args.nvml_timeout,
            vllm_dir=args.vllm_dir,
            active=args.active,
            active_timeout=args.active_timeout,
        )
    except Exception as error:  # a bug of ours: one clear line, not a traceback
        print(redact(f"tmaguard doctor: internal error: {type(error).__name__}: {error}"), file=sys.stderr)
        return 1
    report = redact(report)  # it quotes paths, records and child processes' output: no secrets in it
    if args.as_json:
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
    else:
        render(report)
    return report["exit_code"]
