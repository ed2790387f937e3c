"""The fat-binary reader (doctor/fatbin.py) against NVIDIA's cuobjdump: on a small library compiled
here with nvcc for known architectures (plain, arch-specific "a", family-specific "f", PTX, compressed) and on
real vLLM 0.32.0 extensions; plus the compatibility rules and damaged files."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from vllm_tmaguard.doctor.fatbin import MAGIC, Entry, FatbinError, coverage, read_fatbin
from vllm_tmaguard.process import find_package_dir

KERNEL = "__global__ void add_{name}(float *x, float y) {{ x[threadIdx.x] += y; }}\n"
# Two translation units: one plain, one compressed with arch- and family-specific code and their PTX.
UNITS = {
    "plain": [
        "-gencode=arch=compute_75,code=sm_75",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_100f,code=sm_100f",
        "-gencode=arch=compute_120,code=[sm_120,compute_120]",
        "-gencode=arch=compute_80,code=compute_80",
    ],
    "compressed": [
        "-Xfatbin=-compress-all",
        "-gencode=arch=compute_89,code=sm_89",
        "-gencode=arch=compute_90a,code=compute_90a",
        "-gencode=arch=compute_100a,code=sm_100a",
    ],
}
EXPECTED = {  # what the flags above ask for, per unit
    0: {"sm_75", "sm_90a", "sm_100f", "sm_120", "compute_120", "compute_80"},
    1: {"sm_89", "compute_90a", "sm_100a"},
}


def _tool(name: str) -> str:
    """NVIDIA's tool from PATH, the CUDA toolkit, or (cuobjdump) the copy Triton's wheel ships."""
    candidates = [shutil.which(name), f"/usr/local/cuda/bin/{name}"]
    triton = find_package_dir("triton")
    if triton:
        candidates.append(str(Path(triton) / "backends" / "nvidia" / "bin" / name))
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    raise AssertionError(f"{name} not found (PATH, /usr/local/cuda/bin, triton/backends/nvidia/bin)")


@pytest.fixture(scope="session")
def small_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fatbin")
    objects = []
    for name, flags in UNITS.items():
        source, obj = out / f"{name}.cu", out / f"{name}.o"
        source.write_text(KERNEL.format(name=name))
        subprocess.run(
            [_tool("nvcc"), "-c", "-Xcompiler", "-fPIC", *flags, "-o", str(obj), str(source)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        objects.append(str(obj))
    library = out / "libkernels.so"
    subprocess.run(
        ["gcc", "-shared", "-o", str(library), *objects], check=True, capture_output=True, timeout=120
    )
    return library


def cuobjdump_names(path: Path) -> Counter[tuple[str, str]]:
    """(kind, architecture) as `cuobjdump --list-elf --list-ptx` names them, e.g. ("sass", "sm_90a")."""
    done = subprocess.run(
        [_tool("cuobjdump"), "--list-elf", "--list-ptx", str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    names: Counter[tuple[str, str]] = Counter()
    for line in done.stdout.splitlines():
        match = re.match(r"^(ELF|PTX) file\s+\d+: .*\.(sm_\d+[af]?)\.(?:cubin|ptx)$", line.strip())
        if match:
            names["sass" if match.group(1) == "ELF" else "ptx", match.group(2)] += 1
    return names


def ours_as_cuobjdump(entries: tuple[Entry, ...]) -> Counter[tuple[str, str]]:
    """Our entries in cuobjdump's naming: PTX is called sm_XY too, and cuobjdump 13.1 prints a
    family-specific cubin without its "f" (a sm_100f cubin is listed as sm_100; its PTX keeps the f)."""
    names: Counter[tuple[str, str]] = Counter()
    for entry in entries:
        variant = "" if entry.kind == "sass" and entry.variant == "f" else entry.variant
        names[entry.kind, f"sm_{entry.arch}{variant}"] += 1
    return names


def test_small_library_matches_what_nvcc_was_asked_for(small_library: Path) -> None:
    fatbin = read_fatbin(str(small_library))
    assert fatbin.present and fatbin.containers == 2
    for container, expected in EXPECTED.items():
        assert {e.name for e in fatbin.entries if e.container == container} == expected
    assert all(e.compressed for e in fatbin.entries if e.container == 1)
    assert fatbin.names("sass") == ("sm_75", "sm_89", "sm_90a", "sm_100a", "sm_100f", "sm_120")
    assert fatbin.names("ptx") == ("compute_80", "compute_90a", "compute_120")
    assert not fatbin.arch_specific_only()


def test_small_library_matches_cuobjdump(small_library: Path) -> None:
    assert ours_as_cuobjdump(read_fatbin(str(small_library)).entries) == cuobjdump_names(small_library)


@pytest.mark.parametrize(
    "module", ["_qutlass_C.abi3.so", "_moe_C_stable_libtorch.abi3.so", "vllm_flash_attn/_vllm_fa3_C.abi3.so"]
)
def test_real_vllm_extension_matches_cuobjdump(module: str) -> None:
    path = Path(find_package_dir("vllm")) / module
    fatbin = read_fatbin(str(path))
    assert fatbin.entries
    assert ours_as_cuobjdump(fatbin.entries) == cuobjdump_names(path)


def test_real_vllm_extensions_known_architectures() -> None:
    vllm = Path(find_package_dir("vllm"))
    qutlass = read_fatbin(str(vllm / "_qutlass_C.abi3.so"))
    assert {e.name for e in qutlass.entries} == {"sm_100f"} and qutlass.arch_specific_only()
    fa3 = read_fatbin(str(vllm / "vllm_flash_attn/_vllm_fa3_C.abi3.so"))
    assert {e.name for e in fa3.entries} == {"sm_90a"}
    assert coverage(fa3, (9, 0)).verdict == "native" and coverage(fa3, (12, 0)).verdict == "none"
    fa2 = read_fatbin(str(vllm / "vllm_flash_attn/_vllm_fa2_C.abi3.so"))
    assert {e.name for e in fa2.entries} == {"sm_80", "compute_80"}
    assert coverage(fa2, (8, 9)).verdict == "native" and coverage(fa2, (9, 0)).verdict == "jit"
    core = read_fatbin(str(vllm / "_C_stable_libtorch.abi3.so"))
    for capability in ((7, 5), (8, 0), (8, 9), (9, 0), (10, 0), (12, 0)):
        assert coverage(core, capability).native > 0, capability
    assert coverage(core, (7, 0)).verdict == "none"


@pytest.mark.parametrize(
    ("name", "capability", "runs"),
    [
        ("sm_80", (8, 0), "native"),
        ("sm_80", (8, 9), "native"),  # same major, newer minor
        ("sm_89", (8, 6), None),  # older minor
        ("sm_80", (9, 0), None),  # SASS never crosses a major version
        ("sm_90a", (9, 0), "native"),
        ("sm_90a", (10, 0), None),  # arch-specific: 9.0 only
        ("sm_90a", (12, 0), None),
        ("sm_100a", (10, 3), None),
        ("sm_100f", (10, 3), "native"),  # family: 10.x from 10.0 up
        ("sm_100f", (12, 0), None),
        ("sm_103f", (10, 0), None),
        ("compute_80", (9, 0), "jit"),  # plain PTX: any newer GPU
        ("compute_80", (12, 0), "jit"),
        ("compute_90", (8, 9), None),
        ("compute_90a", (9, 0), "jit"),
        ("compute_90a", (10, 0), None),
        ("compute_100f", (10, 3), "jit"),
        ("compute_100f", (12, 0), None),
    ],
)
def test_compatibility_rules(name: str, capability: tuple[int, int], runs: str | None) -> None:
    kind, rest = name.split("_")
    variant = rest[-1] if rest[-1] in "af" else ""
    entry = Entry("sass" if kind == "sm" else "ptx", int(rest.rstrip("af")), variant, 0)
    assert entry.name == name
    assert entry.runs_on(capability) == runs


def test_coverage_counts_translation_units(small_library: Path) -> None:
    fatbin = read_fatbin(str(small_library))
    at_89 = coverage(fatbin, (8, 9))  # unit 0: compute_80 PTX only; unit 1: sm_89
    assert (at_89.native, at_89.jit, at_89.none, at_89.verdict) == (1, 1, 0, "partial")
    at_86 = coverage(fatbin, (8, 6))
    assert (at_86.native, at_86.jit, at_86.none) == (0, 1, 1) and at_86.verdict == "jit"
    assert at_86.missing_names == ("sm_89", "compute_90a", "sm_100a")
    at_70 = coverage(fatbin, (7, 0))
    assert at_70.verdict == "none" and at_70.none == 2


def test_library_without_device_code(standins) -> None:
    fatbin = read_fatbin(str(standins["driver"]))
    assert not fatbin.present and fatbin.entries == () and coverage(fatbin, (9, 0)).verdict == "no-code"


def _damaged(small_library: Path, tmp_path: Path, offset_in_section: int, data: bytes) -> Path:
    image = bytearray(small_library.read_bytes())
    start = image.find(MAGIC.to_bytes(4, "little"))
    image[start + offset_in_section : start + offset_in_section + len(data)] = data
    damaged = tmp_path / "damaged.so"
    damaged.write_bytes(bytes(image))
    return damaged


@pytest.mark.parametrize(
    ("offset", "data", "why"),
    [
        (0, b"\x11\x22\x33\x44", "bad fat binary magic"),
        (8, (1 << 40).to_bytes(8, "little"), "runs past the section"),
        (16, b"\x07\x00", "unknown fat binary entry (kind 7)"),
        (24, (1 << 40).to_bytes(8, "little"), "runs past its end"),
    ],
)
def test_damaged_fat_binary_is_a_clear_error(
    small_library: Path, tmp_path: Path, offset: int, data: bytes, why: str
) -> None:
    with pytest.raises(FatbinError, match=re.escape(why)):
        read_fatbin(str(_damaged(small_library, tmp_path, offset, data)))


def test_not_an_elf_file_is_a_clear_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\0" * 4096)
    with pytest.raises(FatbinError, match="not an ELF file"):
        read_fatbin(str(junk))
    with pytest.raises(FatbinError, match="No such file"):
        read_fatbin(str(tmp_path / "missing.so"))
