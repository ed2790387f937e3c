"""Fault injection and concurrency: the guard never makes start-up worse (issue 8).

One test per fault, each in fresh processes with vLLM 0.32.0 on an emulated pod. The reference is the same
vLLM process with TMAGUARD_MODE=off, in the same pod, with the same fault: with the guard, vLLM's outcome
(the platform it resolves, or the exception it raises) is exactly that one, and the guard adds one record
line naming the fault; with TMAGUARD_STRICT=1 start-up stops with a message naming it. Where the guard
legitimately does better than "as without" (it still supplies what the layer lacks), the test says so.

Faults that need the kernel's help are real, not simulated: a read-only bind mount and an empty /proc in a
private mount namespace (unshare), unreadable files for a process without CAP_DAC_OVERRIDE (setpriv, when
the tests run as root). Where the machine does not allow them, those tests fail and say what is missing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from podkit import Pod, expected_descriptor, guard_lines, scrubbed_environ

# vLLM's start-up path: `import vllm`, then resolving the platform (which imports the CUDA extension).
RESOLVE = """
import json
out = {}
try:
    import vllm
    print("IMPORTED", flush=True)
    from vllm.platforms import current_platform
    out["platform"] = type(current_platform).__name__
except Exception as error:
    out["error"] = f"{type(error).__name__}: {error}"
print("RESULT " + json.dumps(out), flush=True)
"""
UNDEFINED = "_C_stable_libtorch.abi3.so: undefined symbol: cuTensorMapEncodeTiled"
VLLM_DIR = Path(__import__("vllm_tmaguard.vllm_probe").vllm_probe.find_package_dir() or "")
GUARD_DIR = Path(__import__("vllm_tmaguard").__file__).parent


@dataclass(frozen=True)
class Result:
    returncode: int | None  # None: still running at the time limit (killed)
    stdout: str
    stderr: str
    record_dir: Path

    @property
    def outcome(self) -> dict | None:
        """What the child printed after 'RESULT ' (vLLM's platform or error); None if it printed nothing."""
        lines = [line for line in self.stdout.splitlines() if line.startswith("RESULT ")]
        return json.loads(lines[-1].removeprefix("RESULT ")) if lines else None

    def guard_lines(self) -> list[str]:
        return guard_lines(self.stdout)

    def line(self) -> str:
        lines = self.guard_lines()
        assert len(lines) == 1, f"expected one record line\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return lines[0]

    def last_record(self) -> dict:
        return json.loads((self.record_dir / "last.json").read_text())


class Child:
    """A Python process inside a pod, started now, collected later (several run at once)."""

    def __init__(
        self,
        pod: Pod | None,
        code: str,
        workdir: Path,
        env: Mapping[str, str] | None = None,
        prefix: tuple[str, ...] = (),
        record_dir: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        child_env = scrubbed_environ()
        self.record_dir = record_dir or workdir / "records"
        child_env["TMAGUARD_RECORD_DIR"] = str(self.record_dir)
        child_env.update(pod.env if pod else {})
        child_env.update(env or {})
        self.out, self.err = workdir / "stdout", workdir / "stderr"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.process = subprocess.Popen(
                [*prefix, sys.executable, "-c", code],
                env=child_env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=cwd or workdir,
                start_new_session=True,
            )

    def collect(self, timeout: float) -> Result:
        try:
            returncode: int | None = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            returncode = None
        result = Result(returncode, self.out.read_text(), self.err.read_text(), self.record_dir)
        guard_lines(result.stdout + "\n" + result.stderr)  # every guard line of every pod run is checked
        return result


MODES = {"off": {"TMAGUARD_MODE": "off"}, "guard": {}, "strict": {"TMAGUARD_STRICT": "1"}}


def run_modes(
    pod: Pod,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    code: str = RESOLVE,
    prefix: tuple[str, ...] = (),
    timeout: float = 240,
) -> dict[str, Result]:
    """The same process with the guard off, on and strict, run at the same time."""
    children = {
        mode: Child(pod, code, workdir / mode, {**(env or {}), **extra}, prefix)
        for mode, extra in MODES.items()
    }
    return collect_all(children, timeout)


def collect_all(children: dict[str, Child], timeout: float) -> dict[str, Result]:
    """Every child's result; `timeout` counts for all of them together (they run at the same time)."""
    deadline = time.monotonic() + timeout
    return {name: child.collect(max(0.1, deadline - time.monotonic())) for name, child in children.items()}


def assert_as_without(runs: dict[str, Result], *causes: str) -> str:
    """vLLM's outcome with the guard is the one without; one record line names each cause. Returns it."""
    off, guard = runs["off"], runs["guard"]
    assert off.guard_lines() == []
    assert off.returncode is not None, "the reference run hung"
    assert (guard.returncode, guard.outcome) == (off.returncode, off.outcome), (guard.stdout, guard.stderr)
    line = runs["guard"].line()
    for cause in causes:
        assert cause in line, f"{cause!r} not in {line}"
    return line


def assert_strict_stops(run: Result, *causes: str) -> None:
    assert run.returncode == 1 and run.outcome is None, (run.stdout, run.stderr)
    assert "vllm-tmaguard (TMAGUARD_STRICT=1) stopped start-up: " in run.stderr
    for cause in causes:
        assert cause in run.stderr, f"{cause!r} not in {run.stderr}"


# ---------------------------------------------------------------------------------------------------------
# Real faults from the kernel: prefixes for the child's command line


def _works(prefix: tuple[str, ...]) -> bool:
    try:
        return subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def without_dac_override() -> tuple[str, ...]:
    """A prefix under which file modes bind this user: root loses CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH."""
    if os.geteuid() != 0:
        return ()
    prefix = (shutil.which("setpriv") or "setpriv", "--bounding-set=-dac_override,-dac_read_search", "--")
    if not _works(prefix):
        pytest.fail("setpriv (util-linux) is needed to make file modes bind for root: install util-linux")
    return prefix


def private_mounts(script: str, *args: str) -> tuple[str, ...]:
    """A prefix that runs `script` (sh, with `args` as $1...) in a private mount namespace, then the
    command: `unshare -m` as root, `unshare -rm` (a user namespace) otherwise."""
    unshare = shutil.which("unshare") or "unshare"
    flags = "-m" if os.geteuid() == 0 else "-rm"
    prefix = (unshare, flags, "sh", "-c", f'{script} && shift {len(args)} && exec "$@"', "sh", *args)
    if not _works(prefix):
        pytest.fail("unshare (util-linux) with mount namespaces is needed for this fault: install util-linux")
    return prefix


def read_only(directory: Path) -> tuple[str, ...]:
    return private_mounts('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"', str(directory))


def no_proc() -> tuple[str, ...]:
    return private_mounts("mount -t tmpfs none /proc")


# ---------------------------------------------------------------------------------------------------------
# NVML


def test_nvml_missing(pods, tmp_path: Path) -> None:
    """No libnvidia-ml.so.1 at all. vLLM's platform detection finds no CUDA in both runs (the guard still
    loaded the overlay before asking NVML: harmless, nothing imports the extension)."""
    pod = pods("vcuda")
    (pod.lib_dir / "libnvidia-ml.so.1").unlink()
    runs = run_modes(pod, tmp_path)
    assert runs["off"].outcome == {"platform": "UnspecifiedPlatform"}
    line = assert_as_without(runs, "NVML unavailable: libnvidia-ml.so.1: cannot open shared object file")
    assert "WARNING" in line and "the GPUs are unknown" in line
    assert_strict_stops(runs["strict"], "NVML unavailable: libnvidia-ml.so.1")


def test_nvml_erroring(pods, tmp_path: Path) -> None:
    """nvmlInit fails (NVML_ERROR_UNKNOWN, as a broken driver install answers)."""
    runs = run_modes(pods("vcuda"), tmp_path, {"STANDIN_NVML_FAIL": "999"})
    assert runs["off"].outcome == {"platform": "UnspecifiedPlatform"}
    assert_as_without(runs, "NVML unavailable: nvmlInit_v2: Unknown Error (999)")
    assert_strict_stops(runs["strict"], "nvmlInit_v2: Unknown Error (999)")


def test_nvml_hanging(pods, tmp_path: Path) -> None:
    """nvmlInit never returns. vLLM asks NVML itself while resolving its platform, unbounded, so without
    the guard the process hangs there; `import vllm` alone does not ask NVML and returns. "As without the
    guard" is therefore: `import vllm` returns (the guard's own NVML query is bounded, NVML_TIMEOUT_S; here
    shortened to 2 s) and the process then hangs in vLLM's own call, exactly where it hangs without the
    guard; the record line says NVML did not answer. Strict mode does better than hanging: it stops start-up
    with that cause once the guard's query times out."""
    code = "import vllm_tmaguard.guard as guard\nguard.NVML_TIMEOUT_S = 2.0\n" + RESOLVE
    runs = run_modes(pods("vcuda"), tmp_path, {"STANDIN_NVML_HANG": "1"}, code=code, timeout=30)
    for mode in ("off", "guard"):
        assert runs[mode].returncode is None, f"{mode}: expected a hang\n{runs[mode].stdout}"
        assert "IMPORTED" in runs[mode].stdout and runs[mode].outcome is None
    assert runs["off"].guard_lines() == []
    line = runs["guard"].line()
    assert "NVML did not answer within 2 s" in line and "WARNING" in line
    assert runs["guard"].stdout.index(line) < runs["guard"].stdout.index("IMPORTED")
    assert_strict_stops(runs["strict"], "NVML did not answer within 2 s")


# ---------------------------------------------------------------------------------------------------------
# Unreadable or corrupted ELF files


def _replace(path: Path, data: bytes, mode: int = 0o755) -> None:
    """A new file at `path` (libcuda.so.1 is a hard link of the layer: never write through it)."""
    path.unlink()
    path.write_bytes(data)
    path.chmod(mode)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_libcuda_corrupted(pods, tmp_path: Path, damage: str) -> None:
    """The layer's libcuda.so.1 is cut short or random bytes. The loader stops at that file: cut short, it
    maps segments past the end of the file and the process dies of SIGBUS as soon as torch preloads its
    CUDA libraries (inside `import vllm`); random bytes fail vLLM's extension import ("invalid ELF
    header"). The guard runs before torch, names the file and loads nothing (it must not pick a later
    libcuda.so.1 the loader would never reach); the outcome is the same crash or the same ImportError. In
    strict mode it does better than a crash: start-up stops with the cause."""
    pod = pods("vcuda")
    layer = pod.lib_dir / "libcuda.so.1"
    data = layer.read_bytes()[:4000] if damage == "truncated" else os.urandom(65536)
    _replace(layer, data)
    runs = run_modes(pod, tmp_path)
    if damage == "truncated":
        assert runs["off"].returncode == -signal.SIGBUS
    else:
        assert "libcuda.so.1: invalid ELF header" in runs["off"].outcome["error"]
    line = assert_as_without(runs, f"PROBLEM: {layer} is unreadable")
    assert "WARNING" in line and "loaded" not in line
    assert_strict_stops(runs["strict"], f"{layer} is unreadable")


def test_libcuda_corrupted_with_another_one_later_on_the_path(pods, tmp_path: Path) -> None:
    """A corrupted libcuda.so.1 first on LD_LIBRARY_PATH, the layer's good one after it: the loader stops at
    the first and fails; the guard must not put its overlay in front of the second (that would run vLLM on
    a library this process's loader never loads)."""
    pod = pods("vcuda")
    broken = tmp_path / "broken"
    broken.mkdir()
    # An x86-64 ELF header (the loader does not pass over it) followed by garbage.
    header = b"\x7fELF\x02\x01\x01" + bytes(9) + (3).to_bytes(2, "little") + (62).to_bytes(2, "little")
    (broken / "libcuda.so.1").write_bytes(header + os.urandom(4000))
    runs = run_modes(pod, tmp_path / "runs", {"LD_LIBRARY_PATH": f"{broken}:{pod.lib_dir}"})
    assert "libcuda.so.1" in runs["off"].outcome["error"]
    line = assert_as_without(runs, f"libcuda.so.1 = {broken}/libcuda.so.1 (LD_LIBRARY_PATH)", "unreadable")
    assert "overlay" not in line
    assert_strict_stops(runs["strict"], f"{broken}/libcuda.so.1 is unreadable")


def test_libcuda_unreadable(pods, tmp_path: Path) -> None:
    """libcuda.so.1 that this user may not read: the loader passes over it (EACCES) and finds none."""
    prefix = without_dac_override()
    pod = pods("vcuda")
    layer = pod.lib_dir / "libcuda.so.1"
    _replace(layer, layer.read_bytes(), 0o000)
    runs = run_modes(pod, tmp_path, prefix=prefix)
    assert "libcuda.so.1: cannot open shared object file" in runs["off"].outcome["error"]
    line = assert_as_without(runs, "PROBLEM: libcuda.so.1 not found", f"{layer}: Permission denied")
    assert "WARNING" in line
    assert_strict_stops(runs["strict"], "libcuda.so.1 not found")


def _vllm_copy(base: Path) -> Path:
    """vLLM as a tree of links to the installed files (cp -rs), put first on PYTHONPATH: one file of it can
    be damaged without touching the installed package."""
    assert VLLM_DIR.is_dir(), "vLLM must be installed in the test environment"
    site = base / "site"
    site.mkdir(parents=True)
    subprocess.run(["cp", "-rs", str(VLLM_DIR), str(site / "vllm")], check=True)
    return site


@pytest.mark.parametrize("damage", ["garbage", "unreadable"])
def test_vllm_extension_damaged(pods, tmp_path: Path, damage: str) -> None:
    """vLLM's core extension is random bytes, or a file this user may not read. The loader cannot load it
    either way: vLLM's import fails the same in both runs. The guard does better than "as without" in
    strict mode: it names the damaged file before vLLM trips over it."""
    prefix = without_dac_override() if damage == "unreadable" else ()
    site = _vllm_copy(tmp_path)
    extension = site / "vllm" / "_C_stable_libtorch.abi3.so"
    extension.unlink()
    extension.write_bytes(os.urandom(65536) if damage == "garbage" else b"")
    extension.chmod(0o000 if damage == "unreadable" else 0o755)
    runs = run_modes(pods("vcuda"), tmp_path / "runs", {"PYTHONPATH": str(site)}, prefix=prefix)
    error = runs["off"].outcome["error"]
    assert error.startswith("ImportError: ") and str(extension) in error
    why = "not an ELF file (bad magic)" if damage == "garbage" else "Permission denied"
    line = assert_as_without(runs, f"FAILED: cannot read {extension}: {why}")
    assert "WARNING" in line
    assert_strict_stops(runs["strict"], f"cannot read {extension}: {why}")


# ---------------------------------------------------------------------------------------------------------
# The guard's own libraries


def _guard_copy(base: Path) -> tuple[Path, Path]:
    """A copy of the installed vllm_tmaguard, first on PYTHONPATH (its .pth hook and entry points then
    import the copy): its libraries can be damaged without touching the installed package."""
    top = base / "guard-copy"
    shutil.copytree(GUARD_DIR, top / "vllm_tmaguard", ignore=shutil.ignore_patterns("__pycache__"))
    return top, top / "vllm_tmaguard" / "lib"


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_shim_and_overlay_fail_to_load(pods, tmp_path: Path, damage: str) -> None:
    """Every library of the package is random bytes, or gone: the overlay cannot be built, the shims cannot
    be loaded, and vLLM fails exactly as without the guard, with the reasons on the record line."""
    top, lib = _guard_copy(tmp_path)
    for library in lib.glob("*.so"):
        if damage == "corrupt":
            library.write_bytes(os.urandom(20000))
        else:
            library.unlink()
    runs = run_modes(pods("vcuda"), tmp_path / "runs", {"PYTHONPATH": str(top)})
    assert runs["off"].outcome["error"].endswith(UNDEFINED)
    if damage == "corrupt":
        overlay_why, shim_why = "does not carry the layer placeholder twice", "invalid ELF header"
    else:
        overlay_why, shim_why = "No such file or directory", "No such file or directory"
    line = assert_as_without(
        runs,
        "FAILED: could not load the overlay: ",
        overlay_why,
        f"FAILED: could not load {lib}/libtmaguard_encoders.so: ",
        shim_why,
    )
    assert "WARNING" in line
    assert_strict_stops(runs["strict"], "could not load the overlay", "libtmaguard_encoders.so")


# ---------------------------------------------------------------------------------------------------------
# The file system


def test_read_only_file_system(pods, tmp_path: Path) -> None:
    """TMAGUARD_RECORD_DIR on a read-only file system (a read-only bind mount). The guard does better than
    "as without": it keeps the overlay in memory (memfd) and vLLM starts; the record line says no record
    could be kept. Strict mode stops on that, naming the directory."""
    mount = tmp_path / "ro"
    mount.mkdir()
    records = mount / "records"
    prefix = read_only(mount)
    runs = run_modes(pods("vcuda"), tmp_path / "runs", {"TMAGUARD_RECORD_DIR": str(records)}, prefix=prefix)
    assert runs["off"].outcome["error"].endswith(UNDEFINED)
    assert runs["guard"].outcome == {"platform": "NvmlCudaPlatform"}
    line = runs["guard"].line()
    assert "loaded the overlay /proc/self/fd/" in line and "WARNING" in line
    assert f"FAILED: TMAGUARD_RECORD_DIR unusable: cannot create {records}: Read-only file system" in line
    assert not records.exists()
    assert_strict_stops(runs["strict"], f"cannot create {records}: Read-only file system")


def test_record_write_failure_after_the_check_is_harmless(pods, tmp_path: Path) -> None:
    """The record directory is fine but last.json cannot be written (a directory squats its name): the
    guard still does its work, says so on the line, and leaves no temporary file behind."""
    records = tmp_path / "records"
    records.mkdir(mode=0o700)
    (records / "last.json").mkdir()
    runs = run_modes(pods("vcuda"), tmp_path / "runs", {"TMAGUARD_RECORD_DIR": str(records)})
    assert runs["guard"].outcome == {"platform": "NvmlCudaPlatform"}
    assert f"FAILED: could not write the record to {records}" in runs["guard"].line()
    assert [p.name for p in records.iterdir() if p.name.startswith(".last.")] == []
    assert_strict_stops(runs["strict"], f"could not write the record to {records}")


def test_no_proc(pods, tmp_path: Path) -> None:
    """An empty /proc (tmpfs over it): /proc/self/maps is unreadable. The guard asks the loader itself for
    what is loaded (dl_iterate_phdr), so it behaves exactly as with /proc: here vLLM starts through the
    overlay, and with libcuda.so.1 loaded before vLLM it falls back to the shims and names what stays
    broken (without that fallback it believed nothing was loaded and vLLM failed). Nothing fails, so
    strict mode has no cause to stop on in the first case, and the same cause as with /proc in the second."""
    prefix = no_proc()
    pod = pods("vcuda")
    preload = "import ctypes\nctypes.CDLL('libcuda.so.1')\n" + RESOLVE
    runs = {
        name: Child(pod, code, tmp_path / name, env, prefix if "noproc" in name else ())
        for name, code, env in (
            ("noproc", RESOLVE, {}),
            ("noproc-off", RESOLVE, {"TMAGUARD_MODE": "off"}),
            ("noproc-preload", preload, {}),
            ("proc-preload", preload, {}),
            ("noproc-preload-strict", preload, {"TMAGUARD_STRICT": "1"}),
        )
    }
    done = collect_all(runs, 240)
    assert done["noproc-off"].outcome["error"].endswith(UNDEFINED)
    assert done["noproc"].outcome == {"platform": "NvmlCudaPlatform"}
    assert "INFO" in done["noproc"].line() and "loaded the overlay" in done["noproc"].line()
    assert done["noproc-preload"].outcome == done["proc-preload"].outcome == {"platform": "NvmlCudaPlatform"}
    assert done["noproc-preload"].last_record()["supplied"] == done["proc-preload"].last_record()["supplied"]
    line = done["noproc-preload"].line()
    assert "(mapped)" in line and "loaded libtmaguard_encoders.so" in line and "overlay" not in line
    assert_strict_stops(done["noproc-preload-strict"], "was already loaded when the guard ran")


def test_loaded_objects_without_proc(monkeypatch) -> None:
    """In-process: with /proc/self/maps unreadable, read_self_maps lists the loader's objects."""
    import builtins

    from vllm_tmaguard import loader

    real_open = builtins.open

    def no_proc_open(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(file).startswith("/proc/"):
            raise FileNotFoundError(2, "No such file or directory", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc_open)
    text = loader.read_self_maps()
    assert text is not None
    files = loader.mapped_files(text)
    assert any(os.path.basename(f).startswith("libc.so") for f in files)
    assert all(os.path.exists(f) for f in files)


@pytest.mark.parametrize(
    "library_path",
    [
        "::{lib}",  # empty entries: the current directory
        "{lib}:",  # a trailing separator
        "/nonexistent/dir:{missing}:{lib}",  # directories that do not exist
        "usr/local/nvidia/lib64",  # relative to the current directory
        "./usr/../usr/local/nvidia/lib64;/nowhere",  # '.' and '..', ';' as a separator
        "{file}:{lib}",  # an entry that is a file, not a directory
    ],
)
def test_odd_library_path_entries(pods, tmp_path: Path, library_path: str) -> None:
    """Odd LD_LIBRARY_PATH entries are not a fault: the guard resolves libcuda.so.1 to the file the loader
    then maps (checked in /proc/self/maps after vLLM's import), supplies what it lacks, and vLLM starts, as
    on a plain vCUDA pod; without the guard it fails the same way it always does there."""
    pod = pods("vcuda")
    odd = library_path.format(
        lib=pod.lib_dir, missing=tmp_path / "missing", file=pod.lib_dir / "libcuda.so.1"
    )
    code = RESOLVE + (
        "\nimport os\nmaps = open('/proc/self/maps').read().splitlines()"
        "\nprint('MAPPED ' + json.dumps(sorted({l.split()[-1] for l in maps if 'libcuda-control' in l"
        " or l.endswith('/libcuda.so.1')})))"
    )
    children = {
        mode: Child(pod, code, tmp_path / mode, {"LD_LIBRARY_PATH": odd, **extra}, cwd=pod.root)
        for mode, extra in MODES.items()
    }
    runs = collect_all(children, 240)
    assert runs["off"].outcome["error"].endswith(UNDEFINED)
    for mode in ("guard", "strict"):
        assert runs[mode].outcome == {"platform": "NvmlCudaPlatform"}, runs[mode].stdout
    record = runs["guard"].last_record()
    assert os.path.samefile(record["libcuda"]["path"], pod.lib_dir / "libcuda.so.1")
    assert record["libcuda"]["how"] == "LD_LIBRARY_PATH" and record["failed"] == []
    mapped = json.loads(runs["guard"].stdout.split("MAPPED ", 1)[1].splitlines()[0])
    assert any(os.path.samefile(m, pod.lib_dir / "libcuda.so.1") for m in mapped if "/overlay-" not in m)


def test_library_path_with_a_token_the_guard_cannot_expand(pods, tmp_path: Path) -> None:
    """An LD_LIBRARY_PATH entry with $ORIGIN/$LIB/$PLATFORM, which the loader expands and the guard does
    not: the guard cannot tell which libcuda.so.1 the loader takes, so it supplies nothing (it must not
    put its overlay in front of a file the loader might not load) and vLLM behaves exactly as without it."""
    pod = pods("vcuda")
    runs = run_modes(pod, tmp_path, {"LD_LIBRARY_PATH": f"$ORIGIN/../nvidia:{pod.lib_dir}"})
    assert runs["off"].outcome["error"].endswith(UNDEFINED)
    line = assert_as_without(runs, "PROBLEM: libcuda.so.1 not found", "$ORIGIN/../nvidia: the loader expands")
    assert "loaded" not in line
    assert_strict_stops(runs["strict"], "libcuda.so.1 not found")


# ---------------------------------------------------------------------------------------------------------
# Concurrency

FIRST_ENCODES = r"""
import ctypes, json, os, threading
from vllm_tmaguard import _import_hook
_import_hook.disarm()
from vllm_tmaguard.guard import activate
activate("test")  # loads the overlay or the shims; asking NVML maps libcuda.so.1 (the layer)
if os.environ["TMAGUARD_OVERLAY"] == "auto":
    library = ctypes.CDLL("libcuda.so.1")  # the overlay answers libcuda.so.1
else:
    library = ctypes.CDLL(None)  # the encoders shim, in the global scope
encode = library.cuTensorMapEncodeTiled
u64, u32 = ctypes.c_uint64, ctypes.c_uint32
encode.argtypes = [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p, ctypes.POINTER(u64),
                   ctypes.POINTER(u64), ctypes.POINTER(u32), ctypes.POINTER(u32)] + [ctypes.c_int] * 4
THREADS = 64
start = threading.Barrier(THREADS)
results = [None] * THREADS
def first_call(i):
    descriptor = (ctypes.c_ubyte * 128)()
    dim, stride, box, element = (u64 * 1)(4096 + i), (u64 * 1)(8192), (u32 * 1)(64), (u32 * 1)(1)
    address = 0x7F0000000000 + i * 0x1000
    start.wait()
    status = encode(descriptor, 7, 1, address, dim, stride, box, element, 0, 0, 0, 0)  # releases the GIL
    results[i] = [status, bytes(descriptor).hex(), address, 4096 + i]
threads = [threading.Thread(target=first_call, args=(i,)) for i in range(THREADS)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
source = library.tmaguard_shim_source(b"cuTensorMapEncodeTiled")
print("RESULT " + json.dumps({"calls": results, "source": source}))
"""


@pytest.mark.parametrize("overlay", ["auto", "off"])
def test_64_threads_first_encoder_call(pods, tmp_path: Path, overlay: str) -> None:
    """64 threads released at once make the process's first encoder call (the one that resolves the real
    encoder, under the shim's lock) through the overlay or the shim: every call returns the real driver's
    descriptor, none an error. The driver numbers its calls; everything else in each descriptor is fixed
    by the arguments. Five processes each, for five chances at the race."""
    pod = pods("vcuda")
    env = {"TMAGUARD_OVERLAY": overlay}
    children = [Child(pod, FIRST_ENCODES, tmp_path / f"run-{n}", env) for n in range(5)]
    for child in children:
        result = child.collect(120).outcome
        assert result is not None
        calls = result["calls"]
        assert [status for status, *_ in calls] == [0] * 64
        numbers = []
        for _, descriptor, address, dim in calls:
            data = bytes.fromhex(descriptor)
            numbers.append(int.from_bytes(data[40:48], "little"))
            assert data == expected_descriptor(7, 1, address, dim, numbers[-1])
        assert sorted(numbers) == list(range(1, 65))  # each call reached the real driver exactly once
        assert result["source"] == 2  # resolved once, through the layer's cuGetProcAddress


ACTIVATE_FROM_THREADS = r"""
import json, threading
from vllm_tmaguard import _import_hook
_import_hook.disarm()
from vllm_tmaguard import guard
THREADS = 32
start = threading.Barrier(THREADS)
records = [None] * THREADS
def go(i):
    start.wait()
    records[i] = guard.activate(f"thread-{i}")
threads = [threading.Thread(target=go, args=(i,)) for i in range(THREADS)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
maps = open("/proc/self/maps").read().splitlines()
overlays = sorted({line.split()[-1] for line in maps if "/overlay-" in line})
print("RESULT " + json.dumps({
    "one_record": all(r is records[0] for r in records) and records[0] is not None,
    "trigger": records[0]["trigger"], "overlays": overlays,
}))
"""


def test_activation_from_many_threads_is_one_activation(pods, tmp_path: Path) -> None:
    run = Child(pods("vcuda"), ACTIVATE_FROM_THREADS, tmp_path).collect(120)
    result = run.outcome
    assert result["one_record"] is True and result["trigger"].startswith("thread-")
    assert len(result["overlays"]) == 1
    run.line()  # exactly one record line


def test_concurrent_vllm_processes_share_the_record_directory(pods, tmp_path: Path) -> None:
    """Eight vLLM processes start at once with one TMAGUARD_RECORD_DIR, empty at first. Each activates once
    (one line, its own pid) and starts; meanwhile the shared files are read over and over: never a partial
    file. Afterwards: one overlay file holding exactly the overlay image, one valid scan cache, a valid
    last.json from one of the processes, no temporary file left, every directory 0700."""
    from vllm_tmaguard.overlay import overlay_image

    pod = pods("vcuda")
    records = tmp_path / "shared-records"
    children = [Child(pod, RESOLVE, tmp_path / f"run-{n}", record_dir=records) for n in range(8)]
    reads, bad = [0], []
    finished = threading.Event()

    def reader() -> None:
        while not finished.is_set():
            names = os.listdir(records) if records.is_dir() else []
            for path in (records / n for n in names if n.endswith(".json") and not n.startswith(".")):
                try:
                    json.loads(path.read_text())
                    reads[0] += 1
                except FileNotFoundError:
                    pass  # replaced between the listing and the read
                except ValueError as error:
                    bad.append(f"{path.name}: {error}")
            time.sleep(0.001)

    watcher = threading.Thread(target=reader)
    watcher.start()
    try:
        results = [child.collect(300) for child in children]
    finally:
        finished.set()
        watcher.join()
    assert bad == [] and reads[0] > 0
    pids = set()
    for run in results:
        assert run.outcome == {"platform": "NvmlCudaPlatform"}, run.stdout + run.stderr
        line = run.line()
        pids.add(int(line.split("pid=", 1)[1].split(")", 1)[0]))
    assert len(pids) == 8
    last = json.loads((records / "last.json").read_text())
    assert last["pid"] in pids
    (scan,) = records.glob("vllm-scan-*.json")
    assert json.loads(scan.read_text())["format"] == 1
    (overlay_dir,) = records.glob("overlay-*")
    assert [p.name for p in overlay_dir.iterdir()] == ["libcuda.so.1"]
    groups = frozenset({"encoders", "proc-address", "launch-ex"})
    layer = pod.lib_dir / "libcuda.so.1"
    assert (overlay_dir / "libcuda.so.1").read_bytes() == overlay_image(groups, str(layer))
    assert [p.name for p in records.iterdir() if p.name.startswith(".")] == []
    for directory in (records, overlay_dir):
        assert directory.stat().st_mode & 0o777 == 0o700
