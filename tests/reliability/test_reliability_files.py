"""Damaged, unreadable or missing files (libcuda.so.1, vLLM's extensions, the guard's own libraries), a
read-only file system, no /proc, odd library paths.

The method (each fault against the same vLLM start-up with the guard off): tests/faultkit.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from faultkit import (
    GUARD_DIR,
    GUARD_ONLY,
    MODES,
    RESOLVE,
    UNDEFINED,
    VLLM_DIR,
    Child,
    Result,
    assert_as_without,
    assert_strict_goes_on,
    assert_strict_stops,
    collect_all,
    no_proc,
    read_only,
    run_modes,
    without_dac_override,
)


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
    strict mode it does better than a crash: start-up stops with the cause. (The guard's run: the guard
    alone, which loads nothing: faultkit.)"""
    pod = pods("vcuda", nvml_is_layer=False)
    layer = pod.lib_dir / "libcuda.so.1"
    data = layer.read_bytes()[:4000] if damage == "truncated" else os.urandom(65536)
    _replace(layer, data)
    runs = run_modes(pod, tmp_path, guard_alone=True)
    if damage == "truncated":
        assert runs["off"].returncode == -signal.SIGBUS
    else:
        assert "libcuda.so.1: invalid ELF header" in runs["off"].outcome["error"]
    line = assert_as_without(runs, f"PROBLEM: {layer} is unreadable", guard_alone=True)
    assert "WARNING" in line and "loaded" not in line
    assert_strict_stops(runs["strict"], f"{layer} is unreadable")


def test_libcuda_corrupted_with_another_one_later_on_the_path(pods, tmp_path: Path) -> None:
    """A corrupted libcuda.so.1 first on LD_LIBRARY_PATH, the layer's good one after it: the loader stops at
    the first and fails; the guard must not put its overlay in front of the second (that would run vLLM on
    a library this process's loader never loads)."""
    pod = pods("vcuda", nvml_is_layer=False)
    broken = tmp_path / "broken"
    broken.mkdir()
    # An x86-64 ELF header (the loader does not pass over it) followed by garbage.
    header = b"\x7fELF\x02\x01\x01" + bytes(9) + (3).to_bytes(2, "little") + (62).to_bytes(2, "little")
    (broken / "libcuda.so.1").write_bytes(header + os.urandom(4000))
    env = {"LD_LIBRARY_PATH": f"{broken}:{pod.lib_dir}"}
    runs = run_modes(pod, tmp_path / "runs", env, guard_alone=True)  # the guard loads nothing: faultkit
    assert "libcuda.so.1" in runs["off"].outcome["error"]
    line = assert_as_without(runs, f"PROBLEM: {broken}/libcuda.so.1 is unreadable", guard_alone=True)
    assert "overlay" not in line
    libcuda = runs["guard"].last_record()["libcuda"]
    assert (libcuda["path"], libcuda["how"]) == (f"{broken}/libcuda.so.1", "LD_LIBRARY_PATH")
    assert_strict_stops(runs["strict"], f"{broken}/libcuda.so.1 is unreadable")


def test_libcuda_unreadable(pods, tmp_path: Path) -> None:
    """libcuda.so.1 that this user may not read: the loader passes over it (EACCES) and finds none."""
    prefix = without_dac_override()
    pod = pods("vcuda", nvml_is_layer=False)
    layer = pod.lib_dir / "libcuda.so.1"
    _replace(layer, layer.read_bytes(), 0o000)
    runs = run_modes(pod, tmp_path, prefix=prefix, guard_alone=True)  # the guard loads nothing: faultkit
    assert "libcuda.so.1: cannot open shared object file" in runs["off"].outcome["error"]
    why = f"{layer}: Permission denied"
    line = assert_as_without(runs, "PROBLEM: libcuda.so.1 not found", why, guard_alone=True)
    assert "WARNING" in line
    assert_strict_stops(runs["strict"], "libcuda.so.1 not found")


def _vllm_copy(base: Path) -> Path:
    """vLLM as a tree of links to the installed files (cp -rs), put first on PYTHONPATH: one file of it can
    be damaged without touching the installed package."""
    assert VLLM_DIR.is_dir(), "vLLM must be installed in the test environment"
    site = base / "site"
    site.mkdir(parents=True)
    subprocess.run(["cp", "-rs", str(VLLM_DIR), str(site / "vllm")], check=True, timeout=120)
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
    runs = run_modes(
        pods("vcuda", nvml_is_layer=False), tmp_path / "runs", {"PYTHONPATH": str(site)}, prefix=prefix
    )
    error = runs["off"].outcome["error"]
    assert error.startswith("ImportError: ") and str(extension) in error
    why = "not an ELF file (bad magic)" if damage == "garbage" else "Permission denied"
    line = assert_as_without(runs, f"cannot read {extension}: {why}")
    assert "WARNING" in line
    assert_strict_stops(runs["strict"], f"cannot read {extension}: {why}")


def _guard_copy(base: Path) -> tuple[Path, Path]:
    """A copy of the installed vllm_tmaguard, first on PYTHONPATH (its .pth hook and entry points then
    import the copy): its libraries can be damaged without touching the installed package."""
    top = base / "guard-copy"
    shutil.copytree(GUARD_DIR, top / "vllm_tmaguard", ignore=shutil.ignore_patterns("__pycache__"))
    return top, top / "vllm_tmaguard" / "lib"


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_shim_and_overlay_fail_to_load(off_reference, tmp_path: Path, damage: str) -> None:
    """Every library of the package is random bytes, or gone: the overlay cannot be built, the shims cannot
    be loaded, and vLLM fails exactly as without the guard, with the reasons on the record line."""
    top, lib = _guard_copy(tmp_path)
    for library in lib.glob("*.so"):
        if damage == "corrupt":
            library.write_bytes(os.urandom(20000))
        else:
            library.unlink()
    # The guard off never meets its own libraries: the pod's reference run (faultkit.shared_reference).
    pod, off = off_reference("vcuda", nvml_is_layer=False)
    runs = run_modes(pod, tmp_path / "runs", {"PYTHONPATH": str(top)}, guard_alone=True, off=off)
    assert runs["off"].outcome["error"].endswith(UNDEFINED)
    if damage == "corrupt":
        overlay_why, shim_why = "does not carry the layer placeholder twice", "invalid ELF header"
    else:
        overlay_why, shim_why = "No such file or directory", "No such file or directory"
    line = assert_as_without(
        runs,
        "could not load the overlay: ",
        overlay_why,
        f"could not load {lib}/libtmaguard_encoders.so: ",
        shim_why,
        guard_alone=True,
    )
    assert "WARNING" in line
    assert_strict_stops(runs["strict"], "could not load the overlay", "libtmaguard_encoders.so")


def test_read_only_file_system(off_reference, tmp_path: Path) -> None:
    """TMAGUARD_RECORD_DIR on a read-only file system (a read-only bind mount). The guard does better than
    "as without": its files go to the default private directory and vLLM starts; the record line says why
    the asked one was refused. Strict mode stops on that, naming the directory."""
    mount = tmp_path / "ro"
    mount.mkdir()
    records = mount / "records"
    default = tmp_path / "default-records"  # the processes' /tmp/tmaguard-<uid>
    default.mkdir(mode=0o700)
    prefix = read_only(mount, default)
    # The guard off never meets its record directory: the pod's reference run (faultkit.shared_reference).
    pod, off = off_reference("vcuda", nvml_is_layer=False)
    runs = run_modes(pod, tmp_path / "runs", {"TMAGUARD_RECORD_DIR": str(records)}, prefix=prefix, off=off)
    assert runs["off"].outcome["error"].endswith(UNDEFINED)
    assert runs["guard"].outcome == {"platform": "NvmlCudaPlatform"}
    line = runs["guard"].line()
    assert "overlay loaded;" in line and "WARNING" in line
    assert "PROBLEM: TMAGUARD_RECORD_DIR is refused: cannot create " in line
    assert not records.exists()
    written = json.loads((default / "last.json").read_text())  # where the records went instead
    assert "record-dir-refused" in [problem["code"] for problem in written["problems"]]
    assert_strict_stops(runs["strict"], f"cannot create {records}: Read-only file system")


def test_record_write_failure_after_the_check_is_harmless(pods, tmp_path: Path) -> None:
    """The record directory is fine but last.json cannot be written (a directory squats its name): the
    guard still does its work, says so on the line, and leaves no temporary file behind."""
    records = tmp_path / "records"
    records.mkdir(mode=0o700)
    (records / "last.json").mkdir()
    pod, env = pods("vcuda", nvml_is_layer=False), {"TMAGUARD_RECORD_DIR": str(records)}
    # Not a fault vLLM meets without the guard (it writes no record): no run with the guard off.
    children = {
        mode: Child(pod, RESOLVE, tmp_path / mode, {**env, **MODES[mode]}) for mode in ("guard", "strict")
    }
    runs = collect_all(children, 240)
    assert runs["guard"].outcome == {"platform": "NvmlCudaPlatform"}
    line = runs["guard"].line()
    assert f"PROBLEM: could not write the record to {records}" in line
    assert [p.name for p in records.iterdir() if p.name.startswith(".last.")] == []
    assert_strict_stops(runs["strict"], f"could not write the record to {records}")


def test_no_proc(pods, tmp_path: Path) -> None:
    """An empty /proc (tmpfs over it): /proc/self/maps is unreadable. The guard asks the loader itself for
    what is loaded (dl_iterate_phdr), so it behaves exactly as with /proc: here vLLM starts through the
    overlay, and with libcuda.so.1 loaded before vLLM it falls back to the shims and names what stays
    broken (without that fallback it believed nothing was loaded and vLLM failed). Nothing fails, so
    strict mode has no cause to stop on in the first case, and the same cause as with /proc in the second."""
    prefix = no_proc()
    pod = pods("vcuda", nvml_is_layer=False)
    preload = "import ctypes\nctypes.CDLL('libcuda.so.1')\n"
    runs = {
        name: Child(pod, code, tmp_path / name, env, prefix if "noproc" in name else ())
        for name, code, env in (
            ("noproc", RESOLVE, {}),
            ("noproc-off", RESOLVE, {"TMAGUARD_MODE": "off"}),
            ("noproc-preload", preload + RESOLVE, {}),
            # With /proc, the guard alone: the same decisions make the same process for vLLM.
            ("proc-preload", preload + GUARD_ONLY, {}),
            ("noproc-preload-strict", preload + RESOLVE, {"TMAGUARD_STRICT": "1"}),
        )
    }
    done = collect_all(runs, 240)
    assert done["noproc-off"].outcome["error"].endswith(UNDEFINED)
    assert done["noproc"].outcome == {"platform": "NvmlCudaPlatform"}
    assert "INFO" in done["noproc"].line() and "overlay loaded" in done["noproc"].line()
    assert done["noproc-preload"].outcome == {"platform": "NvmlCudaPlatform"}
    without, with_proc = done["noproc-preload"].last_record(), done["proc-preload"].last_record()
    assert without["supplied"] == with_proc["supplied"]
    assert [(a["kind"], a["target"]) for a in without["actions"]] == [
        (a["kind"], a["target"]) for a in with_proc["actions"]
    ]
    said = [
        done[name].line().split("] ", 1)[1].split("; details")[0]
        for name in ("noproc-preload", "proc-preload")
    ]
    assert said[0] == said[1]
    line, record = done["noproc-preload"].line(), done["noproc-preload"].last_record()
    assert "shims loaded (encoders, proc-address)" in line and "overlay loaded" not in line
    assert record["libcuda"]["how"] == "mapped"
    assert [(a["kind"], a["target"]) for a in record["actions"][:2]] == [
        ("load-shim", "encoders"),
        ("load-shim", "proc-address"),
    ]
    assert_strict_stops(done["noproc-preload-strict"], "was already loaded when the guard ran")


def test_loaded_objects_without_proc(monkeypatch) -> None:
    """In-process: with /proc/self/maps unreadable, read_loaded_objects lists the loader's objects."""
    import builtins

    from vllm_tmaguard import loaded

    real_open = builtins.open

    def no_proc_open(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(file).startswith("/proc/"):
            raise FileNotFoundError(2, "No such file or directory", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc_open)
    text = loaded.read_loaded_objects()
    assert text is not None
    files = loaded.mapped_files(text)
    assert any(os.path.basename(f).startswith("libc.so") for f in files)
    assert all(os.path.exists(f) for f in files)


ODD_LIBRARY_PATHS = [
    "::{lib}",  # empty entries: the current directory
    "{lib}:",  # a trailing separator
    "/nonexistent/dir:{missing}:{lib}",  # directories that do not exist
    "usr/local/nvidia/lib64",  # relative to the current directory
    "./usr/../usr/local/nvidia/lib64;/nowhere",  # '.' and '..', ';' as a separator
    "{file}:{lib}",  # an entry that is a file, not a directory
]


# The libcuda.so.1 files mapped in this process (the layer's, or the overlay's and the layer's), printed after
# "MAPPED ".
MAPPED_LIBCUDA = """
import json as _json
_maps = open("/proc/self/maps").read().splitlines()
_mapped = {l.split()[-1] for l in _maps if l.endswith("/libcuda.so.1") or "libcuda-control" in l}
print("MAPPED " + _json.dumps(sorted(_mapped)))
"""
# Which libcuda.so.1 the loader maps for a process started with these variables and this working directory,
# and whether it exports the encoder vLLM's extension needs: the part of vLLM's start without the guard that
# an LD_LIBRARY_PATH decides (the extension's own DT_NEEDED libcuda.so.1 is searched for the same way).
LOADER_ONLY = """
import ctypes, json
library = ctypes.CDLL("libcuda.so.1")
print("RESULT " + json.dumps({"encoder": hasattr(library, "cuTensorMapEncodeTiled")}))
""" + MAPPED_LIBCUDA


def _mapped(run: Result) -> list[str]:
    return json.loads(run.stdout.split("MAPPED ", 1)[1].splitlines()[0])


@pytest.mark.parametrize("library_path", ODD_LIBRARY_PATHS)
def test_odd_library_path_entries(off_reference, tmp_path: Path, library_path: str) -> None:
    """Odd LD_LIBRARY_PATH entries are not a fault: the guard resolves libcuda.so.1 to the file the loader
    then maps (checked in /proc/self/maps after vLLM's import), supplies what it lacks, and vLLM starts, as
    on a plain vCUDA pod; without the guard it fails the same way it always does there: the loader maps the
    same layer file, without the encoder, as for the pod's plain path, where vLLM's start with the guard
    off fails on it (the pod's reference run: faultkit.shared_reference)."""
    pod, off = off_reference("vcuda", nvml_is_layer=False)
    layer = pod.lib_dir / "libcuda.so.1"
    odd = library_path.format(lib=pod.lib_dir, missing=tmp_path / "missing", file=layer)
    code = RESOLVE + MAPPED_LIBCUDA
    # Strict mode finds nothing to stop on: its vLLM start once (the first case), the guard alone in the
    # others (faultkit.assert_strict_goes_on).
    strict_alone = library_path != ODD_LIBRARY_PATHS[0]
    codes = {"off": LOADER_ONLY, "guard": code, "strict": GUARD_ONLY if strict_alone else code}
    children = {
        mode: Child(pod, codes[mode], tmp_path / mode, {"LD_LIBRARY_PATH": odd, **extra}, cwd=pod.root)
        for mode, extra in MODES.items()
    }
    runs = collect_all(children, 240)
    assert off.outcome["error"].endswith(UNDEFINED)
    assert runs["off"].outcome == {"encoder": False}, runs["off"].stdout
    loaded = _mapped(runs["off"])
    assert len(loaded) == 1 and os.path.samefile(loaded[0], layer), loaded
    for mode in ("guard", "strict") if not strict_alone else ("guard",):
        assert runs[mode].outcome == {"platform": "NvmlCudaPlatform"}, runs[mode].stdout
    if strict_alone:
        assert_strict_goes_on(runs["strict"], runs["guard"])
    record = runs["guard"].last_record()
    assert os.path.samefile(record["libcuda"]["path"], layer)
    assert record["libcuda"]["how"] == "LD_LIBRARY_PATH" and record["problems"] == []
    assert any(os.path.samefile(m, layer) for m in _mapped(runs["guard"]) if "/overlay-" not in m)


def test_library_path_with_a_token_the_guard_cannot_expand(pods, tmp_path: Path) -> None:
    """An LD_LIBRARY_PATH entry with $ORIGIN/$LIB/$PLATFORM, which the loader expands and the guard does
    not: the guard cannot tell which libcuda.so.1 the loader takes, so it supplies nothing (it must not
    put its overlay in front of a file the loader might not load) and vLLM behaves exactly as without it."""
    pod = pods("vcuda", nvml_is_layer=False)
    env = {"LD_LIBRARY_PATH": f"$ORIGIN/../nvidia:{pod.lib_dir}"}
    runs = run_modes(pod, tmp_path, env, guard_alone=True)  # the guard loads nothing: faultkit
    assert runs["off"].outcome["error"].endswith(UNDEFINED)
    causes = ("PROBLEM: libcuda.so.1 not found", "$ORIGIN/../nvidia: the loader expands")
    line = assert_as_without(runs, *causes, guard_alone=True)
    assert "loaded" not in line
    assert_strict_stops(runs["strict"], "libcuda.so.1 not found")
