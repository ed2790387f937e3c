"""The ELF reader against vLLM's real extension binaries, cross-checked with binutils."""

import os
import subprocess

import pytest

from vllm_tmaguard.process import find_package_dir
from vllm_tmaguard.stages.elf import ElfError, read_elf


def _nm_undefined(path: str) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--undefined-only", path], capture_output=True, text=True, check=True, timeout=120
    )
    return {line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line.split()[0] == "U"}


def _extension(relative: str) -> str:
    package = find_package_dir()
    assert package, "vLLM must be installed in the test environment (scripts/setup_env.sh)"
    return os.path.join(package, relative)


@pytest.mark.parametrize(
    "relative",
    ["_C_stable_libtorch.abi3.so", "vllm_flash_attn/_vllm_fa3_C.abi3.so", "cumem_allocator.abi3.so"],
)
def test_undefined_driver_symbols_match_nm(relative: str) -> None:
    path = _extension(relative)
    info = read_elf(path, prefixes=(b"cu",))
    expected = {s for s in _nm_undefined(path) if s.startswith("cu")}
    assert info.undefined == expected and info.undefined
    assert "libcuda.so.1" in info.needed


def test_main_extension_needs_the_encoder() -> None:
    info = read_elf(_extension("_C_stable_libtorch.abi3.so"), prefixes=(b"cu",))
    assert {"cuTensorMapEncodeTiled", "cuGetProcAddress_v2", "cuPointerGetAttribute"} <= info.undefined


def test_soname_and_defined_symbols_of_a_system_library() -> None:
    info = read_elf("/lib/x86_64-linux-gnu/libc.so.6", prefixes=(b"mallo",))
    assert info.soname == "libc.so.6" and "malloc" in info.defined and not info.undefined


@pytest.mark.parametrize(
    "content", [b"", b"hello", b"\x7fELF" + b"\xff" * 60, b"\x7fELF\x02\x01" + b"\0" * 200]
)
def test_garbage_raises_elf_error_naming_the_file(tmp_path, content: bytes) -> None:
    path = tmp_path / "lib.so"
    path.write_bytes(content)
    with pytest.raises(ElfError) as caught:
        read_elf(str(path))
    assert str(path) in str(caught.value)


def test_truncated_real_library_raises_elf_error(tmp_path) -> None:
    with open("/lib/x86_64-linux-gnu/libc.so.6", "rb") as file:
        data = file.read()
    path = tmp_path / "truncated.so"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ElfError):
        read_elf(str(path))


def test_unreadable_file_raises_elf_error(tmp_path) -> None:
    with pytest.raises(ElfError):
        read_elf(str(tmp_path / "missing.so"))
