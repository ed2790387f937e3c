"""The release files, built by scripts/build_wheels.sh as a maintainer does: the sdist, and from it one
py3-none-manylinux_2_28 wheel per architecture that `auditwheel show` accepts; the x86-64 wheel installed
into a fresh CPython 3.12 with no C compiler on PATH guards vLLM on an emulated vCUDA pod."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from podkit import OLD_VLLM_IMPORT, build_old_vllm, child_environ, expected_descriptor
from releasekit import ARCHES, Release

from vllm_tmaguard.stages.elf import EM_AARCH64, EM_X86_64, read_elf

MACHINES = {"x86_64": EM_X86_64, "aarch64": EM_AARCH64}
LIBRARIES = 3  # the overlay and two shims (setup.py)
COMPILERS = ("gcc", "cc", "clang", "x86_64-linux-gnu-gcc")


def python_312() -> str:
    """A CPython 3.12 other than the test environment's own."""
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))
    candidates += [p for p in (shutil.which("python3.12"),) if p]
    for candidate in candidates:
        done = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, timeout=120
        )
        if done.returncode == 0 and done.stdout.strip() == b"(3, 12)":
            return candidate
    pytest.fail(f"no CPython 3.12 found (looked at {candidates or 'python3.12 on PATH'}): install one")


def test_the_script_builds_the_sdist_and_a_wheel_per_architecture_from_it(release: Release) -> None:
    for arch in ARCHES:
        assert re.search(rf"wheel manylinux_2_28_{arch} from the sdist \(.*gcc\) +\d+ s", release.printed)
        assert f"{release.wheels[arch].name}: manylinux_2_28 satisfied" in release.printed
    with tarfile.open(release.sdist) as sdist:
        names = sdist.getnames()
    top = release.sdist.name.removesuffix(".tar.gz")
    for member in ("setup.py", "pyproject.toml", "vllm_tmaguard.pth", "vllm_tmaguard/csrc/entry_points.c"):
        assert f"{top}/{member}" in names, member
    assert f"{top}/vllm_tmaguard/csrc/glibc_compat.h" in names
    assert not [n for n in names if "/tests/" in n or n.endswith(".so")]


@pytest.mark.parametrize("arch", ARCHES)
def test_auditwheel_show_finds_manylinux_2_28_and_no_external_library(release: Release, arch: str) -> None:
    auditwheel = Path(sys.executable).parent / "auditwheel"
    shown = subprocess.run(
        [auditwheel, "show", release.wheels[arch]], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    tag = re.search(rf'consistent with the following platform tag: "manylinux_2_(\d+)_{arch}"', text)
    assert tag and int(tag.group(1)) <= 28, text
    assert "The wheel requires no external shared libraries!" in text


@pytest.mark.parametrize("arch", ARCHES)
def test_wheel_holds_the_hook_and_libraries_for_its_architecture(
    release: Release, arch: str, tmp_path: Path
) -> None:
    with zipfile.ZipFile(release.wheels[arch]) as wheel:
        wheel.extractall(tmp_path)
        names = wheel.namelist()
    (info,) = {Path(n).parts[0] for n in names if ".dist-info/" in n}
    metadata = (tmp_path / info / "WHEEL").read_text()
    assert f"Tag: py3-none-manylinux_2_28_{arch}\n" in metadata and "Root-Is-Purelib: false" in metadata
    assert (tmp_path / "vllm_tmaguard.pth").read_text().strip() == "import vllm_tmaguard._import_hook"
    assert "vllm.platform_plugins" in (tmp_path / info / "entry_points.txt").read_text()
    libraries = sorted((tmp_path / "vllm_tmaguard" / "lib").glob("*.so"))
    assert len(libraries) == LIBRARIES
    for library in libraries:
        elf = read_elf(str(library), prefixes=(b"cu",))
        assert elf.machine == MACHINES[arch], library.name
        # Nothing beyond glibc by name; the overlay's layer is named at run time (overlay.py).
        assert set(elf.needed) == {"libdl.so.2", "libc.so.6"}, (library.name, elf.needed)


def test_x86_64_wheel_guards_vllm_in_a_compiler_less_python_312(
    release: Release, pods, tmp_path: Path
) -> None:
    venv = tmp_path / "py312"
    subprocess.run([python_312(), "-m", "venv", venv], check=True, capture_output=True, timeout=120)
    path = str(venv / "bin")
    assert not [c for c in COMPILERS if shutil.which(c, path=path)]
    install = subprocess.run(
        [
            venv / "bin/python",
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            release.wheels["x86_64"],
        ],
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    pod, old_vllm = pods("vcuda"), build_old_vllm(tmp_path)

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        env = child_environ(pod, tmp_path / "records", {"PATH": path, "PYTHONPATH": str(old_vllm), **extra})
        return subprocess.run([*args], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120)

    def result(done: subprocess.CompletedProcess[str]) -> dict:
        line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
        return json.loads(line.removeprefix("RESULT "))

    python = str(venv / "bin/python")
    where = run(
        python, "-c", "import sys, vllm_tmaguard; print(sys.version_info[:2], vllm_tmaguard.__file__)"
    )
    assert where.stdout.startswith(f"(3, 12) {venv}/lib/python3.12/site-packages/vllm_tmaguard/")
    off = result(run(python, "-c", OLD_VLLM_IMPORT, TMAGUARD_MODE="off"))
    assert off["error"].endswith("_C.abi3.so: undefined symbol: cuTensorMapEncodeTiled")
    guarded = result(run(python, "-c", OLD_VLLM_IMPORT))
    assert guarded["encode"] == [0, expected_descriptor(7, 1, 0x1000, 4096, 1).hex()]
    record = json.loads((tmp_path / "records" / "last.json").read_text())
    assert record["trigger"] == "import-hook" and record["supplied"]["cuTensorMapEncodeTiled"] == "overlay"
    assert record["actions"][0]["kind"] == "load-overlay", record["actions"]
    check = run(str(venv / "bin/tmaguard"), "check", "--json")
    assert json.loads(check.stdout)["supplied"]["cuTensorMapEncodeTiled"] == "overlay", check.stderr


def test_the_script_asks_before_installing_a_system_package(tmp_path: Path) -> None:
    """Without --install-cross-compiler a missing cross compiler stops the script with the command to run;
    no package manager is called (none is on this PATH, and apt-get would be the first thing it runs)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in Path("/usr/bin").iterdir():
        if not tool.name.startswith(("aarch64-linux-gnu-", "apt")):
            (bin_dir / tool.name).symlink_to(tool)
    script = Path(__file__).resolve().parent.parent / "scripts" / "build_wheels.sh"
    done = subprocess.run(
        ["bash", str(script), str(tmp_path / "dist")],
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "aarch64-linux-gnu-gcc is missing: apt-get install gcc-aarch64-linux-gnu" in done.stderr
    assert "--install-cross-compiler" in done.stderr and not list((tmp_path / "dist").iterdir())
