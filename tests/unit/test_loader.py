"""The loader's search order and ld.so.cache parsing, checked against this machine's real loader."""

import os
import shutil
import struct
import subprocess

from vllm_tmaguard.loaded import mapped_files
from vllm_tmaguard.process import split_library_path
from vllm_tmaguard.stages.loader import read_ld_so_cache, resolve_library


def test_ld_so_cache_matches_ldconfig() -> None:
    with open("/etc/ld.so.cache", "rb") as file:
        pairs = read_ld_so_cache(file.read(), os.uname().machine)
    listed = subprocess.run(
        ["ldconfig", "-p"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    expected = set()
    for line in listed.splitlines()[1:]:
        name, _, rest = line.strip().partition(" (")
        flags, _, path = rest.partition(") => ")
        if "x86-64" in flags or "AArch64" in flags:
            expected.add((name, path))
    assert set(pairs) == expected and len(pairs) > 10


def test_ld_so_cache_garbage_gives_nothing() -> None:
    assert read_ld_so_cache(b"", "x86_64") == []
    assert read_ld_so_cache(b"glibc-ld.so.cache1.1" + struct.pack("<I", 10**9), "x86_64") == []


def test_empty_library_path_entry_is_current_directory() -> None:
    assert split_library_path("/a::b", "/cwd") == ["/a", "/cwd/", "/cwd/b"]
    assert split_library_path("", "/cwd") == []


def test_mapped_files_from_maps_text() -> None:
    text = (
        "7f00-7f01 r--p 00000000 08:01 12 /usr/lib/libcuda.so.550.142\n"
        "7f01-7f02 r-xp 00001000 08:01 12 /usr/lib/libcuda.so.550.142\n"
        "7f02-7f03 rw-p 00000000 00:00 0 [heap]\n"
        "7f03-7f04 r--p 00000000 08:01 13 /tmp/x.so (deleted)\n"
    )
    assert mapped_files(text) == ["/usr/lib/libcuda.so.550.142", "/tmp/x.so"]


def test_library_path_wins_and_wrong_machine_is_skipped(tmp_path) -> None:
    libc = "/lib/x86_64-linux-gnu/libc.so.6" if os.path.exists("/lib/x86_64-linux-gnu/libc.so.6") else None
    assert libc, "this test needs the system libc"
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    (first / "libfoo.so.1").write_bytes(b"\x7fELF\x01\x01" + b"\0" * 100)  # 32-bit garbage: skipped
    shutil.copy(libc, second / "libfoo.so.1")
    found = resolve_library("libfoo.so.1", {"LD_LIBRARY_PATH": f"{first}:{second}"}, maps_text="")
    assert found.path == str(second / "libfoo.so.1") and found.how == "LD_LIBRARY_PATH"
    assert len(found.skipped) == 1 and str(first) in found.skipped[0]


def test_cache_used_when_library_path_misses() -> None:
    found = resolve_library("libc.so.6", {"LD_LIBRARY_PATH": "/nonexistent"}, maps_text="")
    assert found.how == "ld.so.cache" and found.path and found.path.endswith("libc.so.6")


def test_mapped_library_answers_first(tmp_path) -> None:
    maps = "7f00-7f01 r--p 00000000 08:01 12 /lib/x86_64-linux-gnu/libc.so.6\n"
    found = resolve_library("libc.so.6", {}, maps_text=maps)
    assert found.how == "mapped" and found.path == "/lib/x86_64-linux-gnu/libc.so.6"


def test_not_found_anywhere(tmp_path) -> None:
    found = resolve_library(
        "libcuda.so.1", {"LD_LIBRARY_PATH": str(tmp_path)}, root=str(tmp_path), maps_text=""
    )
    assert found.path is None and found.how == "not found"


def test_library_path_view_keeps_only_entries_that_hold_the_library(tmp_path) -> None:
    """What LD_LIBRARY_PATH contributes to the loader's search, for comparing processes (verdict.py)."""
    from vllm_tmaguard.verdict import library_path_view

    (tmp_path / "has").mkdir()
    (tmp_path / "has/libcuda.so.1").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    plain = library_path_view("libcuda.so.1", f"{tmp_path}/has", "/")
    padded = library_path_view("libcuda.so.1", f"{tmp_path}/empty:{tmp_path}/has:", str(tmp_path / "empty"))
    assert [entry[0] for entry in plain] == [f"{tmp_path}/has/libcuda.so.1"] and padded == plain
    expanded = library_path_view("libcuda.so.1", f"{tmp_path}/has:$ORIGIN/x:{tmp_path}/has", "/")
    assert expanded[-1] == ["token", "/$ORIGIN/x/libcuda.so.1"]  # the search stops there
