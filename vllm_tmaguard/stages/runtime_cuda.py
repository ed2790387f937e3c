"""The CUDA runtime torch and vLLM were built for, read from their files without importing either, against
the NVIDIA driver the pod runs (docs/design.md §2.12). A CUDA runtime refuses a driver older than the first
driver of its major release (from CUDA 11 on, minor version compatibility holds within a major release only):
vLLM's CUDA 13 wheels fail at CUDA initialisation on an R535 node whatever entry points the guard supplies,
and the record must say so rather than "supplied".

Read (through the door, so each file is a verdict input): torch/version.py as text (`cuda = '13.0'`), the
NEEDED libcudart.so.<major> of vLLM's extensions (elf.py), and the version in the name of the file
libcuda.so.1 resolves to (libcuda.so.580.65.06): the library the runtime asks, which differs from the kernel
module only under NVIDIA's forward compatibility (the cuda-compat package). Decided by too_old, a pure
function of the versions and the GPUs' names."""

import os
import re

from .. import files
from ..codes import DRIVER_TOO_OLD
from ..process import find_package_dir
from . import door
from .elf import ElfError, read_elf
from .gpu import cuda_version_of_driver, driver_tuple
from .outcomes import Problem
from .values import value_type

TYPE_CHECKING = False
if TYPE_CHECKING:  # the stages' types, for annotations only
    from .facts import Facts
    from .gpu import GpuFacts

# The oldest driver a runtime of each CUDA major release runs on (NVIDIA's CUDA toolkit release notes, minor
# version compatibility): 13.x needs R580, 12.x R525, 11.x R450. Not below, with or without the guard.
MINIMUM_DRIVER = {13: (580, 65, 6), 12: (525, 60, 13), 11: (450, 80, 2)}
# vLLM publishes CUDA 12.9 builds beside its CUDA 13 ones: they run on R525-R575 drivers.
_CUDA_12 = 12
_VERSION_PY_LIMIT = 64 << 10
_TORCH_CUDA = re.compile(r"""^cuda\s*(?::[^=\n]*)?=\s*['"](\d+)\.(\d+)""", re.M)
_CUDART = re.compile(r"^libcudart\.so\.(\d+)")
_LIBRARY_VERSION = re.compile(r"^libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$")
# GPUs NVIDIA's forward compatibility does not run on (it is for data-center GPUs): cuInit fails with
# CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (804).
_NO_FORWARD_COMPAT = re.compile(r"GeForce|TITAN|Quadro|\bRTX\b(?!.*Server Edition)")


@value_type
class CudaBuild:
    """The CUDA runtime each package was built for, and the file that says so."""

    torch: tuple[int, int] | None = None  # torch/version.py's cuda, e.g. (13, 0); None: CPU build or unknown
    torch_file: str | None = None
    vllm: int | None = None  # the major of the libcudart.so.<major> vLLM's extensions need
    vllm_file: str | None = None


def parse_torch_cuda(text: str) -> tuple[int, int] | None:
    """torch/version.py's `cuda: Optional[str] = '13.0'` -> (13, 0); None for `cuda = None` (a CPU build)."""
    match = _TORCH_CUDA.search(text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def cudart_major(needed: tuple[str, ...]) -> int | None:
    """The CUDA major release of the runtime a library links: NEEDED libcudart.so.13 -> 13."""
    return next((int(m.group(1)) for name in needed if (m := _CUDART.match(name))), None)


def library_version(path: str | None) -> str | None:
    """The driver version in the name of the file `path` resolves to (libcuda.so.1 -> libcuda.so.535.54.03);
    None where the name carries none (a sharing layer's file, a copy named libcuda.so.1)."""
    if path is None:
        return None
    match = _LIBRARY_VERSION.match(os.path.basename(files.realpath(path)))
    return match.group(1) if match else None


def read_build(vllm_dir: str | None, extensions: tuple[str, ...]) -> CudaBuild:
    """torch's CUDA from the torch package beside vLLM (else on sys.path), vLLM's from the first of its
    extensions (paths) that links the CUDA runtime. Unreadable files count as unknown."""
    search = [os.path.dirname(vllm_dir)] if vllm_dir else []
    torch_dir = find_package_dir("torch", search) if search else None
    torch_dir = torch_dir or find_package_dir("torch")
    torch, torch_file = None, None
    if torch_dir is not None:
        torch_file = os.path.join(torch_dir, "version.py")
        text = door.read_text(torch_file, _VERSION_PY_LIMIT)
        torch = parse_torch_cuda(text) if text is not None else None
    for path in extensions:
        try:
            major = cudart_major(read_elf(path, symbols=False).needed)
        except ElfError:
            continue
        if major is not None:
            return CudaBuild(torch, torch_file, major, path)
    return CudaBuild(torch, torch_file)


def forward_compatible(gpu_name: str) -> bool:
    return not _NO_FORWARD_COMPAT.search(gpu_name)


def _label(version: tuple[int, int, int]) -> str:
    return ".".join(f"{part:02d}" if i else str(part) for i, part in enumerate(version))


def _cuda_label(cuda: int | None) -> str:
    return f"CUDA {cuda // 1000}.{cuda % 1000 // 10}" if cuda else "a CUDA older than 10.0"


def _built_for(build: CudaBuild, major: int) -> str:
    """Who needs a CUDA `major` runtime, and the verb: "torch (CUDA 13.0) and vLLM (libcudart.so.13) need"."""
    torch = None
    if build.torch and build.torch[0] == major:
        torch = f"torch (CUDA {build.torch[0]}.{build.torch[1]})"
    vllm = f"vLLM (libcudart.so.{major})" if build.vllm == major else None
    if torch and vllm:
        return f"{torch} and {vllm} need"
    return f"{torch or vllm} needs"


def _remedy(
    node_driver: tuple[int, int, int] | None,
    major: int,
    build: CudaBuild,
    gpu_names: tuple[str, ...],
    vllm_version: str | None,
    offer_compat: bool,
) -> str:
    """The fixes, the surest first: the driver needed; vLLM's CUDA 12.9 build where the node runs R525+;
    NVIDIA's forward compatibility where every GPU is a data-center one."""
    steps = [f"upgrade the node's NVIDIA driver to {_label(MINIMUM_DRIVER[major])} or newer"]
    if major > _CUDA_12 and node_driver is not None and node_driver >= MINIMUM_DRIVER[_CUDA_12]:
        release = f"vLLM {vllm_version}'s" if vllm_version else "vLLM's"
        steps.append(
            f"or install {release} CUDA 12.9 build, which runs on R525-R575 drivers (the +cu129 wheel of "
            "vLLM's release, with torch from https://download.pytorch.org/whl/cu129)"
        )
    if offer_compat:
        minor = build.torch[1] if build.torch and build.torch[0] == major else "x"
        unsupported = [name for name in gpu_names if not forward_compatible(name)]
        if unsupported:
            steps.append(
                "(NVIDIA's forward compatibility, the cuda-compat package, does not run on "
                f"{unsupported[0]}: CUDA fails with error 804)"
            )
        elif gpu_names:
            steps.append(
                "or, on these data-center GPUs, NVIDIA's forward compatibility: the "
                f"cuda-compat-{major}-{minor} package's libcuda.so.1 first on LD_LIBRARY_PATH (on the driver "
                "branches NVIDIA supports it from)"
            )
        else:
            steps.append(
                "or NVIDIA's forward compatibility (the cuda-compat package), on data-center GPUs only"
            )
    return "; ".join(steps)


def too_old(
    module: str | None,
    library: str | None,
    build: CudaBuild,
    gpu_names: tuple[str, ...],
    vllm_version: str | None = None,
) -> Problem | None:
    """The problem where the driver cannot run the CUDA runtime torch and vLLM were built for; None where it
    can or the versions are unknown. `module`: the kernel module's version (/proc/driver/nvidia/version);
    `library`: the version libcuda.so.1's file names, which the runtime asks (None: unknown, taken to be the
    module's); `gpu_names`: the GPUs given to the pod, for whether forward compatibility can run there."""
    majors = [m for m in (build.torch[0] if build.torch else None, build.vllm) if m in MINIMUM_DRIVER]
    node, answering = driver_tuple(module), driver_tuple(library)
    driver, driver_text = (answering, library) if answering else (node, module)
    if not majors or driver is None:
        return None
    major = max(majors)
    needed = MINIMUM_DRIVER[major]
    who = _built_for(build, major)
    # A libcuda.so.1 of a newer branch than the kernel module: NVIDIA's forward compatibility (cuda-compat).
    compat = answering is not None and node is not None and answering[0] > node[0]
    unsupported = [name for name in gpu_names if not forward_compatible(name)]
    consequence = (
        "vLLM fails at CUDA initialisation ({}), whatever entry points libcuda.so.1 has or the guard "
        "supplies: no CUDA call works"
    )
    if compat and unsupported:
        if node is not None and node >= needed:
            fix = f"take the cuda-compat libcuda.so.1 out of the image: driver {module} runs CUDA {major}"
        else:
            fix = _remedy(node, major, build, (), vllm_version, offer_compat=False)
        return Problem(
            DRIVER_TOO_OLD,
            cause=f"libcuda.so.1 is NVIDIA's forward-compatibility driver {library} (the cuda-compat "
            f"package) over kernel module {module}, which {unsupported[0]} cannot run",
            consequence=consequence.format("CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, 804"),
            fix=fix,
            subject="/proc/driver/nvidia/version",
        )
    if driver >= needed:
        return None
    which = f"the forward-compatibility libcuda.so.1 {library}" if compat else f"NVIDIA driver {driver_text}"
    return Problem(
        DRIVER_TOO_OLD,
        cause=f"{which} (up to {_cuda_label(cuda_version_of_driver(driver_text))}); {who} "
        f"{_label(needed)} or newer",
        consequence=consequence.format(
            "cudaErrorInsufficientDriver, 35; torch: 'The NVIDIA driver on your system is too old'"
        ),
        fix=_remedy(node or driver, major, build, gpu_names, vllm_version, offer_compat=not compat),
        subject="/proc/driver/nvidia/version",
    )


def driver_problems(facts: "Facts", gpus: "GpuFacts") -> tuple[Problem, ...]:
    """too_old for this pod: its kernel module, the file libcuda.so.1 resolves to (a layer's or the guard's
    overlay names no version: the module's is taken), torch's and vLLM's builds."""
    if gpus.driver_version is None or facts.driver.path is None or not facts.vllm.found:
        return ()  # no driver library at all is the first problem (supply.py's)
    extensions = tuple(e.path for e in facts.vllm.extensions if not e.error)
    build = read_build(facts.vllm.package_dir, extensions)
    names = tuple(gpu.name for gpu in gpus.gpus)
    library = library_version(facts.driver.path)
    problem = too_old(gpus.driver_version, library, build, names, facts.vllm.version)
    return (problem,) if problem else ()
