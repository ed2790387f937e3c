"""Emulated GPU pods for tests that run without a GPU.

`build_standins` compiles the stand-in libraries in tests/csrc with gcc;
`build_pod` lays out a pod's file system (driver directory, sharing-layer
fingerprints) under a temporary directory and returns the environment a
subprocess needs to run "inside" it; `build_old_vllm` fakes vLLM 0.6.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sysconfig
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
CSRC = TESTS_DIR / "csrc"
DEFAULT_BUILD_DIR = TESTS_DIR / ".build"

KINDS = ("bare", "vcuda", "vcuda-v105", "vcuda-fork", "hami", "lupine", "nogpu")
# The other sharing layers found in the field (issue 26), laid out as their device plugins lay them out:
# vgpu-manager's /etc/ld.so.preload entry, nvshare's preload and its scheduler's socket, lupine's client
# libcuda.so.1, and a KubeShare pod as a debug copy sees it (its hook mounted, the preload taken out: on
# this glibc the hook kills every process it is preloaded into). Kept apart from KINDS, whose pods every
# stand-in test builds.
FIELD_KINDS = ("vgpu-manager", "nvshare", "kubeshare", "lupine-client")
VGPU_MANAGER_PRELOAD = "/etc/vgpu-manager/driver/libvgpu-control.so"
NVSHARE_PRELOAD = "/usr/lib/nvshare/libnvshare.so"
NVSHARE_SOCKET = "var/run/nvshare/scheduler.sock"
KUBESHARE_HOOK = "/kubeshare/library/libgemhook.so.1"
# tkestack vCUDA master, its release v1.0.5, and a fork with the CUDA 12 entry points
# (tests/csrc/standin_layer.c).
VCUDA_KINDS = ("vcuda", "vcuda-v105", "vcuda-fork")
# The vCUDA layer's memory quota in the emulated pods, unless a test asks for another.
VCUDA_QUOTA = 20 << 30
# A model name per compute capability: the guard reads the name from /proc/driver/nvidia
# (stages/gpu.py) and vLLM asks the stand-in NVML; both must see the same GPU.
GPU_OF_CAPABILITY = {
    "7.5": "Tesla T4",
    "8.0": "NVIDIA A100-SXM4-80GB",
    "8.6": "NVIDIA A10G",
    "8.9": "NVIDIA GeForce RTX 4090",
    "9.0": "NVIDIA H100 80GB HBM3",
    "10.0": "NVIDIA B200",
    "12.0": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
}

OLD_VLLM_VERSION = "0.6.6.post1"
# The pods' NVIDIA driver: an R580 one, which runs the CUDA 13 torch and vLLM of the test environment (an
# older one is a pod where vLLM cannot initialise CUDA: vllm_tmaguard/stages/runtime_cuda.py).
DEFAULT_DRIVER = "580.95.05"

CFLAGS = ["-O2", "-fPIC", "-shared", "-Wall", "-Werror"]
# Exported functions bind to themselves (cuGetProcAddress hands out their
# addresses) even when a preload such as libvgpu.so defines the same names.
LIB_FLAGS = ["-fvisibility=hidden", "-Wl,-Bsymbolic"]


class StandinBuildError(RuntimeError):
    """gcc is missing or failed to compile a stand-in."""


# Variables of the developer's or CI's shell that would change what a child process in a pod sees.
SCRUBBED_PREFIXES = (
    "TMAGUARD_",
    "VLLM_",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "STANDIN_",
    "CUDA_",
    "LUPINE_",
    "PYTHONPATH",
    "POD_MANAGER_PORT",  # KubeShare's, vgpu-manager's and nvshare's (FIELD_KINDS)
    "MANAGER_VISIBLE_DEVICES",
    "NVSHARE_",
)


# The test suite's own record directory (tests/conftest.py makes it): a process a test starts without naming
# a record directory writes there, never into the user's default one (/tmp/tmaguard-<uid>).
SUITE_RECORD_DIR: str | None = None


def scrubbed_environ(extra_prefixes: tuple[str, ...] = ()) -> dict[str, str]:
    """os.environ without the variables that would leak into an emulated pod's processes; in the test
    suite, TMAGUARD_RECORD_DIR its own directory (SUITE_RECORD_DIR)."""
    prefixes = SCRUBBED_PREFIXES + extra_prefixes
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    if SUITE_RECORD_DIR is not None:
        env["TMAGUARD_RECORD_DIR"] = SUITE_RECORD_DIR
    return env


def child_environ(
    pod: Pod | None,
    record_dir: Path,
    extra: Mapping[str, str] | None = None,
    extra_prefixes: tuple[str, ...] = (),
) -> dict[str, str]:
    """The environment of a process run inside `pod`: scrubbed, its own record dir, the pod's variables."""
    env = scrubbed_environ(extra_prefixes)
    env["TMAGUARD_RECORD_DIR"] = str(record_dir)
    env.update(pod.env if pod is not None else {})
    env.update(extra or {})
    return env


# A private mount namespace whose /dev is a tmpfs holding the usual device nodes (bound from the real /dev)
# and a /dev/termination-log that is the file given as $2, bound ($1 = bind) or a symbolic link to it
# ($1 = link: a container whose termination-message path someone replaced with a link): what a Kubernetes
# container sees, without a file in this machine's /dev. The real /dev is held at an empty directory made in
# /tmp (the namespace's mounts are its own, its directories are not), removed once the nodes are bound.
_KUBELET_DEV = r"""set -e
how=$1 termination_log=$2; shift 2
saved=$(mktemp -d); mount --rbind /dev "$saved"
mount -t tmpfs -o mode=755 tmpfs /dev
for node in null zero full random urandom tty; do
  if [ -e "$saved/$node" ]; then touch "/dev/$node"; mount --bind "$saved/$node" "/dev/$node"; fi
done
ln -s /proc/self/fd /dev/fd; ln -s /proc/self/fd/0 /dev/stdin; ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr; mkdir /dev/shm; mount --bind "$saved/shm" /dev/shm 2> /dev/null || true
umount -l "$saved"; rmdir "$saved"
if [ "$how" = link ]; then ln -s "$termination_log" /dev/termination-log
else touch /dev/termination-log; mount --bind "$termination_log" /dev/termination-log; fi
exec "$@"
"""


# Appended to the code of every `python -c` child the test runners start (conftest.run_python,
# faultkit.Child). A process that imported torch and vLLM spends about a CPU-second after its last line
# tearing down the interpreter (freeing torch's and sympy's objects; no system call, nothing printed): a
# fifth of each vLLM start in the suite, and no part of what any test looks at. So, once the code has run
# to its end, the exit handlers run, the output is flushed and the process exits at once, as vLLM's own
# workers do (os._exit). Code that ends otherwise (an exception, sys.exit, a signal) ends as before, and so
# does a process with a thread still running that it would have waited for.
QUICK_EXIT = """
def _quick_exit():
    import atexit, os, sys, threading
    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            return
    os._exit(0)
_quick_exit()
"""


def as_kubelet_container(command: list[str], termination_log: Path, linked: bool = False) -> list[str]:
    """`command` run where /dev/termination-log is `termination_log` (which must exist: the kubelet makes
    it; the guard only appends), or with linked=True a symbolic link to it."""
    how = "link" if linked else "bind"
    return ["unshare", "-m", "sh", "-c", _KUBELET_DEV, "sh", how, str(termination_log), *command]


# The guard's one log line must stay readable in `kubectl logs` (vllm_tmaguard/stages/record.py render_text).
GUARD_LINE_LIMIT = 400
GUARD_LINE_PREFIX = "(tmaguard pid="


def guard_lines(output: str) -> list[str]:
    """The guard's log lines in a child's output, each checked against GUARD_LINE_LIMIT. Every runner of pod
    processes calls this on what the child printed. A JSON record (TMAGUARD_LOG_FORMAT=json, for log
    shippers) is the full record by design and exempt."""
    lines = [line for line in output.splitlines() if line.startswith(GUARD_LINE_PREFIX)]
    long = [line for line in lines if len(line) > GUARD_LINE_LIMIT and "] {" not in line]
    assert not long, f"guard line over {GUARD_LINE_LIMIT} characters ({len(long[0])}):\n{long[0]}"
    return lines


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    record_dir: Path

    @property
    def result(self) -> dict:
        """The JSON the child printed after 'RESULT '."""
        lines = [line for line in self.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, f"child printed no RESULT line\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return json.loads(lines[-1].removeprefix("RESULT "))

    def guard_lines(self) -> list[str]:
        return guard_lines(self.stdout)

    def last_record(self) -> dict:
        return json.loads((self.record_dir / "last.json").read_text())

    def record_of(self, pid: int) -> dict:
        """One process's own record (children such as Humming's build helpers write theirs too)."""
        return json.loads((self.record_dir / f"process-{pid}.json").read_text())


@dataclass(frozen=True)
class Pod:
    kind: str
    # The emulated pod's file-system root; tests pass it to the guard as TMAGUARD_ROOT.
    root: Path
    # root / "usr/local/nvidia/lib64": libcuda.so.1 (layer or driver) and libnvidia-ml.so.1.
    lib_dir: Path
    # lib_dir / f"libcuda.so.{driver}"; None where the pod has no real driver.
    real_driver: Path | None
    # Variables to ADD to a subprocess environment to run "inside" the pod.
    env: dict[str, str]

    def environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """os.environ overlaid with the pod's variables (and `extra`)."""
        merged = dict(os.environ)
        merged.update(self.env)
        if extra:
            merged.update(extra)
        return merged


@dataclass(frozen=True)
class _Target:
    output: str
    source: str
    flags: tuple[str, ...]
    libs: tuple[str, ...] = ()


def _control_layer(output: str, *defines: str) -> _Target:
    """A variant of the stand-in layer (standin_layer.c with `defines`), named like vCUDA's library."""
    flags = (*LIB_FLAGS, *defines, "-Wl,-soname,libcuda-control.so")
    return _Target(output, "standin_layer.c", flags, ("-ldl", "-lpthread"))


_TARGETS: dict[str, _Target] = {
    "driver": _Target(
        "libcuda-standin-driver.so",
        "standin_driver.c",
        (*LIB_FLAGS, "-Wl,-soname,libcuda.so.1"),
    ),
    "layer": _control_layer("libcuda-control.so"),
    "layer_v105": _control_layer("libcuda-control-v1.0.5.so", "-DLAYER_VCUDA_V105"),
    "layer_fork": _control_layer("libcuda-control-fork.so", "-DLAYER_FORK"),
    "layer_standalone": _Target(
        "libcuda-lupine.so",
        "standin_layer.c",
        (*LIB_FLAGS, "-DLAYER_STANDALONE", "-Wl,-soname,libcuda.so.1"),
        ("-ldl",),
    ),
    "nvml": _Target(
        "libnvidia-ml-standin.so",
        "standin_nvml.c",
        (*LIB_FLAGS, "-pthread", "-Wl,-soname,libnvidia-ml.so.1"),
    ),
    "vgpu": _Target("libvgpu.so", "standin_vgpu.c", ("-fvisibility=hidden",), ("-ldl",)),
    "vgpu_manager": _Target(
        "libvgpu-control.so",
        "standin_vgpu_manager.c",
        ("-fvisibility=hidden", "-Wl,-soname,libvgpu-control.so"),
        ("-ldl",),
    ),
    "nvshare": _Target(
        "libnvshare.so",
        "standin_nvshare.c",
        ("-fvisibility=hidden", "-pthread", "-Wl,-soname,libnvshare.so"),
        ("-ldl",),
    ),
    # No SONAME, glibc-private symbols left undefined: loadable only where glibc still exports them (< 2.34).
    "gemhook": _Target("libgemhook.so.1", "standin_gemhook.c", ("-fvisibility=hidden",)),
    "layer_lupine_client": _Target(
        "libcuda-lupine-client.so",
        "standin_layer.c",
        (*LIB_FLAGS, "-DLAYER_STANDALONE", "-DLAYER_LUPINE_CLIENT", "-Wl,-soname,libcuda.so.1"),
        ("-ldl",),
    ),
}


def _gcc() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise StandinBuildError("gcc not found on PATH; the stand-in libraries cannot be built")
    return gcc


def _up_to_date(output: Path, inputs: list[Path]) -> bool:
    if not output.exists():
        return False
    built = output.stat().st_mtime
    return all(p.stat().st_mtime <= built for p in inputs)


def _compile(output: Path, inputs: list[Path], args: list[str]) -> None:
    """Run gcc into a temporary name and rename, so readers never see half a file."""
    if _up_to_date(output, inputs):
        return
    fd, tmp_name = tempfile.mkstemp(prefix=output.name + ".", suffix=".tmp", dir=output.parent)
    os.close(fd)
    cmd = [_gcc(), *args, "-o", tmp_name]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
        if proc.returncode != 0:
            raise StandinBuildError(f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
        os.chmod(tmp_name, 0o755)
        os.replace(tmp_name, output)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)


def _python_include() -> Path:
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").exists():
        raise StandinBuildError(f"Python.h not found in {include}")
    return include


def build_standins(build_dir: Path) -> dict[str, Path]:
    """Compile every stand-in (once; up-to-date outputs are kept).

    Returns name -> path for: driver, layer, layer_v105, layer_fork, layer_standalone, nvml, vgpu,
    vgpu_manager, nvshare, gemhook, layer_lupine_client, old_vllm_ext, driver_calls_ext.
    """
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    headers = [CSRC / "standin_entry_points.h", CSRC / "standin_dlsym.h"]
    this_file = Path(__file__).resolve()
    out: dict[str, Path] = {}
    # Serialise concurrent builders (pytest-xdist workers, parallel sessions).
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name, target in _TARGETS.items():
            source = CSRC / target.source
            output = build_dir / target.output
            args = [*CFLAGS, *target.flags, str(source), *target.libs]
            _compile(output, [source, *headers, this_file], args)
            out[name] = output

        # The extension must say NEEDED libcuda.so.1: link through a libcuda.so name.
        link_dir = build_dir / "link"
        link_dir.mkdir(exist_ok=True)
        link = link_dir / "libcuda.so"
        if not link.is_symlink() or os.readlink(link) != str(out["driver"]):
            tmp_link = link_dir / f"libcuda.so.{os.getpid()}.tmp"
            if tmp_link.is_symlink() or tmp_link.exists():
                tmp_link.unlink()
            tmp_link.symlink_to(out["driver"])
            os.replace(tmp_link, link)
        # CPython extensions linked against libcuda.so.1 like vLLM's: the vLLM 0.6 `_C` look-alike and the
        # driver_calls probe (calls driver entry points through its own relocations).
        for name, source_name, output_name in (
            ("old_vllm_ext", "old_vllm_ext.c", "old_vllm/_C.abi3.so"),
            ("driver_calls_ext", "driver_calls_ext.c", "driver_calls/driver_calls.abi3.so"),
        ):
            ext_source = CSRC / source_name
            ext = build_dir / output_name
            ext.parent.mkdir(exist_ok=True)
            ext_args = [
                *CFLAGS,
                f"-I{_python_include()}",
                str(ext_source),
                f"-L{link_dir}",
                "-Wl,--no-as-needed",
                "-lcuda",
            ]
            _compile(ext, [ext_source, this_file, out["driver"]], ext_args)
            out[name] = ext
    return out


def _unique_dir(base: Path, name: str) -> Path:
    candidate = base / name
    n = 1
    while candidate.exists():
        candidate = base / f"{name}-{n}"
        n += 1
    candidate.mkdir(parents=True)
    return candidate


def _install(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o755)


def _touch(path: Path, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    os.chmod(path, mode)


def write_gpus(root: Path, name: str, driver: str, count: int) -> None:
    """The NVIDIA kernel module's files the guard reads (stages/gpu.py), and the pod's device nodes."""
    proc = root / "proc/driver/nvidia"
    proc.mkdir(parents=True)
    (proc / "version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Release Build  (standin)\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    for minor in range(count):
        bus = proc / f"gpus/0000:{minor + 1:02x}:00.0"
        bus.mkdir(parents=True)
        (bus / "information").write_text(
            f"Model: \t\t {name}\nIRQ:   \t\t 42\nBus Location: \t 0000:{minor + 1:02x}:00.0\n"
            f"Device Minor: \t {minor}\nBus Type: \t PCIe\n"
        )
        _touch(root / f"dev/nvidia{minor}")


def build_pod(
    base: Path,
    kind: str,
    *,
    gpu_name: str | None = None,
    cc: str = "8.9",
    driver: str = DEFAULT_DRIVER,
    gpu_count: int = 1,
    quota: int = VCUDA_QUOTA,
    vcuda_config: bool = True,
    nvml_is_layer: bool = True,
    scheduler_socket: bool = True,
    build_dir: Path | None = None,
) -> Pod:
    """Lay out an emulated pod of `kind` (see KINDS) in a new directory under `base`. The GPU is named
    after its compute capability unless `gpu_name` says otherwise; `quota`: the vCUDA layer's memory
    quota (its vcuda.config, absent when `vcuda_config` is False). `nvml_is_layer` False: a vCUDA pod
    whose libnvidia-ml.so.1 is a plain NVML that loads libcuda.so.1 by that name in nvmlInit (as NVIDIA's
    does): the layer then answers libcuda.so.1 for vLLM's extensions whatever its init does, which the
    tests of damaged files rely on. (In a real vCUDA pod torch has mapped libcuda.so.1 before that.)
    `scheduler_socket` False: an nvshare pod whose scheduler's socket is not there (FIELD_KINDS)."""
    if kind not in KINDS + FIELD_KINDS:
        raise ValueError(f"unknown pod kind {kind!r}; expected one of {', '.join(KINDS + FIELD_KINDS)}")
    gpu_name = gpu_name or GPU_OF_CAPABILITY[cc]
    libs = build_standins(build_dir or DEFAULT_BUILD_DIR)
    root = _unique_dir(Path(base), kind)
    lib_dir = root / "usr/local/nvidia/lib64"
    lib_dir.mkdir(parents=True)
    env: dict[str, str] = {"LD_LIBRARY_PATH": str(lib_dir), "TMAGUARD_ROOT": str(root)}

    if kind not in VCUDA_KINDS or not nvml_is_layer:
        _install(libs["nvml"], lib_dir / "libnvidia-ml.so.1")
    if kind == "nogpu":
        env["STANDIN_NVML_COUNT"] = "0"
        return Pod(kind, root, lib_dir, None, env)
    write_gpus(root, gpu_name, driver, gpu_count)
    env.update(
        {
            "STANDIN_NVML_NAME": gpu_name,
            "STANDIN_NVML_CC": cc,
            "STANDIN_NVML_DRIVER": driver,
            "STANDIN_NVML_COUNT": str(gpu_count),
        }
    )

    if kind in ("lupine", "lupine-client"):
        client = libs["layer_standalone" if kind == "lupine" else "layer_lupine_client"]
        _install(client, lib_dir / "libcuda.so.1")
        env["LUPINE_SERVER"] = "127.0.0.1:9999"
        return Pod(kind, root, lib_dir, None, env)

    real_driver = lib_dir / f"libcuda.so.{driver}"
    _install(libs["driver"], real_driver)
    if kind in ("bare", "hami", *FIELD_KINDS):
        _install(libs["driver"], lib_dir / "libcuda.so.1")
    if kind in FIELD_KINDS:
        env.update(_field_layer(root, kind, libs, scheduler_socket))
    if kind == "hami":
        vgpu = root / "usr/local/vgpu/libvgpu.so"
        vgpu.parent.mkdir(parents=True)
        _install(libs["vgpu"], vgpu)
        preload = root / "etc/ld.so.preload"
        preload.parent.mkdir(parents=True)
        preload.write_text("/usr/local/vgpu/libvgpu.so\n")
        (root / "tmp").mkdir()
        env.update(
            {
                "LD_PRELOAD": str(vgpu.resolve()),
                "CUDA_DEVICE_MEMORY_LIMIT_0": "20g",
                "CUDA_DEVICE_SM_LIMIT": "50",
                "STANDIN_VGPU_STATE": str(root / "tmp/vgpu-state"),
            }
        )

    if kind in VCUDA_KINDS:
        layer = {"vcuda": "layer", "vcuda-v105": "layer_v105", "vcuda-fork": "layer_fork"}
        control = lib_dir / "libcuda-control.so"
        _install(libs[layer[kind]], control)
        # vCUDA's device plugin hard-links libcuda-control.so as the driver and NVML libraries; the real
        # ones stay beside it under their versioned names (the layer opens libcuda.so.<driver version>).
        for name in (
            "libcuda.so.1",
            "libcuda.so",
            *(("libnvidia-ml.so.1", "libnvidia-ml.so") if nvml_is_layer else ()),
        ):
            os.link(control, lib_dir / name)
        _install(libs["nvml"], lib_dir / f"libnvidia-ml.so.{driver}")
        if vcuda_config:
            (root / "etc/vcuda").mkdir(parents=True)
            (root / "etc/vcuda/vcuda.config").write_bytes(vcuda_config_bytes(quota))
        _touch(root / "etc/vcuda/vcuda.sock")
        _touch(root / "usr/local/nvidia/bin/gpu-client", 0o755)
        env["STANDIN_VCUDA_ROOT"] = str(root)

    return Pod(kind, root, lib_dir, real_driver, env)


def vcuda_config_bytes(quota: int, enable: bool = True) -> bytes:
    """vCUDA's /etc/vcuda/vcuda.config as gpu-manager writes it: its resource_data_t (vcuda-controller's
    include/hijack.h, packed, 8240 bytes), here with the quota and `enable` set (0: whole GPUs, no limit)."""
    data = bytearray(8240)
    data[0:9] = b"test-pod\0"
    struct.pack_into("<i", data, 48, 100)  # limit
    struct.pack_into("<Q", data, 8208, quota)  # gpu_memory
    struct.pack_into("<ii", data, 8216, 100, 0)  # utilization, hard_limit
    struct.pack_into("<i", data, 8232, int(enable))
    return bytes(data)


def _field_layer(root: Path, kind: str, libs: dict[str, Path], scheduler_socket: bool) -> dict[str, str]:
    """The files and variables of a FIELD_KINDS pod (its libcuda.so.1 is NVIDIA's); the loader's own
    /etc/ld.so.preload of this machine is never touched: the pod's preload file is under its root, and its
    processes get the library through LD_PRELOAD."""
    if kind == "vgpu-manager":
        control = root / VGPU_MANAGER_PRELOAD.lstrip("/")
        control.parent.mkdir(parents=True)
        _install(libs["vgpu_manager"], control)
        (root / "etc/ld.so.preload").write_text(VGPU_MANAGER_PRELOAD + "\n")
        (root / "etc/vgpu-manager/config").mkdir(parents=True)
        return {
            "LD_PRELOAD": str(control.resolve()),
            "CUDA_MEM_LIMIT_0": "8192m",
            "CUDA_CORE_LIMIT_0": "50",
            "MANAGER_VISIBLE_DEVICES": "GPU-5c2f6b3a-0000-4000-8000-000000000001",
        }
    if kind == "nvshare":
        hook = root / NVSHARE_PRELOAD.lstrip("/")
        hook.parent.mkdir(parents=True)
        _install(libs["nvshare"], hook)
        # nvshare opens the driver by its unversioned name (the container toolkit's link).
        os.symlink("libcuda.so.1", root / "usr/local/nvidia/lib64/libcuda.so")
        socket_path = root / NVSHARE_SOCKET
        socket_path.parent.mkdir(parents=True)
        if scheduler_socket:  # a socket file, as the plugin's bind mount makes one (tests listen on it)
            bind_socket(socket_path).close()
        return {"LD_PRELOAD": str(hook.resolve()), "STANDIN_NVSHARE_ROOT": str(root)}
    if kind == "kubeshare":
        hook = root / KUBESHARE_HOOK.lstrip("/")
        hook.parent.mkdir(parents=True)
        _install(libs["gemhook"], hook)
        (hook.parent / "schedulerIP.txt").write_text("10.0.0.7\n")
        return {"POD_MANAGER_PORT": "50051", "POD_NAME": "default/vllm"}
    return {}


def bind_socket(path: Path) -> socket.socket:
    """A Unix socket bound at `path` and listening (its file stays after close: a scheduler gone away)."""
    if len(str(path).encode()) >= 108:
        raise ValueError(f"{path}: too long for a Unix socket address (108 bytes)")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    return listener


# Imports the vLLM 0.6 look-alike (build_old_vllm on PYTHONPATH), encodes through its `_C`, prints RESULT.
OLD_VLLM_IMPORT = """
import json
out = {}
try:
    import vllm
    descriptor, status = vllm._C.encode_probe()
    out["encode"] = [status, descriptor.hex()]
    out["version"] = vllm.__version__
except Exception as error:
    out["error"] = f"{type(error).__name__}: {error}"
print("RESULT " + json.dumps(out))
"""


def build_old_vllm(base: Path, build_dir: Path | None = None) -> Path:
    """A directory to put first on PYTHONPATH that holds a vLLM 0.6.6.post1 look-alike.

    Its vllm/__init__.py imports vllm._C (as 0.6's platforms/cuda.py did at
    import), a compiled extension needing cuTensorMapEncodeTiled from libcuda.so.1.
    """
    libs = build_standins(build_dir or DEFAULT_BUILD_DIR)
    top = _unique_dir(Path(base), "old-vllm")
    pkg = top / "vllm"
    pkg.mkdir()
    (pkg / "_version.py").write_text(
        f"__version__ = version = {OLD_VLLM_VERSION!r}\n"
        "__version_tuple__ = version_tuple = (0, 6, 6, 'post1')\n"
    )
    (pkg / "__init__.py").write_text(
        '"""vLLM 0.6.6.post1 stand-in (tests/podkit.py)."""\n'
        "from vllm._version import __version__, __version_tuple__  # noqa: F401\n"
        "from vllm import _C  # noqa: F401,E402\n"
    )
    _install(libs["old_vllm_ext"], pkg / "_C.abi3.so")
    # importlib.metadata.version("vllm") should see 0.6 too, ahead of site-packages.
    dist = top / f"vllm-{OLD_VLLM_VERSION}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {OLD_VLLM_VERSION}\n")
    (dist / "top_level.txt").write_text("vllm\n")
    return top


def expected_descriptor(data_type: int, rank: int, address: int, dim0: int, call: int) -> bytes:
    """The stand-in driver's 128-byte descriptor, computed from the specification."""
    desc = bytearray((i * 7 + 3) & 0xFF for i in range(128))
    desc[0:16] = b"TMAGUARD-STANDIN"
    struct.pack_into("<IIQQQ", desc, 16, data_type, rank, address, dim0 if rank else 0, call)
    return bytes(desc)
