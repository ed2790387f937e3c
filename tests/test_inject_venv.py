"""`tmaguard inject --venv`: the package placed in a virtual environment's site-packages as pip would place
it (llm-d's images run vLLM from a `uv venv` at /opt/vllm, which has no pip), into real venvs made here by
`python -m venv --without-pip`: that venv's python then arms the guard's import hook at start through the
.pth, with nothing on PYTHONPATH; from a wheel, the files are pip's own (pip run beside it); what is not a
venv, or a venv that cannot be told, is refused with nothing written. No vLLM import: the hook in
sys.meta_path at start is what the pip install's .pth gives (tests/test_no_rebuild.py runs vLLM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """\
import importlib.metadata, json, sys
hook = sys.modules.get("vllm_tmaguard._import_hook")
print(json.dumps({
    "armed": [f.__module__ for f in sys.meta_path if getattr(f, "__name__", "") == "VllmImportHook"],
    "hook": getattr(hook, "__file__", None),
    "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
    "venv": sys.prefix != sys.base_prefix,
    "plugins": [e.value for e in importlib.metadata.entry_points(group="vllm.platform_plugins")],
}))
"""  # imports nothing of the guard's itself: what is there was imported at interpreter start


def make_venv(root: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    return root


def site_packages(venv: Path) -> Path:
    (site,) = venv.glob("lib/python3.*/site-packages")
    return site


def tmaguard(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command, run by this test environment's Python (which has the package), not from the source."""
    return subprocess.run(
        [sys.executable, "-m", "vllm_tmaguard", *map(str, args)], capture_output=True, text=True, cwd=cwd,
        timeout=300,
    )


def probe(python: Path, env: dict[str, str] | None = None) -> dict:
    clean = {"PATH": "/usr/bin:/bin", "HOME": str(python.parent), **(env or {})}  # no PYTHONPATH of ours
    done = subprocess.run(
        [python, "-c", PROBE], capture_output=True, text=True, env=clean, check=True, timeout=300
    )
    return json.loads(done.stdout)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_venv_gets_the_pth_and_its_python_arms_the_guard_at_start(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "vllm")
    site = site_packages(venv)
    assert probe(venv / "bin/python")["armed"] == []  # the bare venv: no guard
    done = tmaguard("inject", "--venv", venv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"in {site} and tmaguard in {venv}/bin" in done.stdout
    assert f"{venv}/bin/python arms the guard at start (vllm_tmaguard.pth)" in done.stdout
    found = probe(venv / "bin/python")
    assert found == {
        "armed": ["vllm_tmaguard._import_hook"],
        "hook": f"{site}/vllm_tmaguard/_import_hook.py",  # this venv's copy, read through its .pth
        "sitecustomize": None,  # none written: the .pth does it in site-packages
        "venv": True,
        "plugins": ["vllm_tmaguard.plugin:platform_plugin"],  # vLLM finds the plugin in the copied dist-info
    }
    assert (site / "vllm_tmaguard.pth").read_text().strip() == "import vllm_tmaguard._import_hook"
    (dist_info,) = site.glob("vllm_tmaguard-*.dist-info")
    assert not {"INSTALLER", "REQUESTED", "direct_url.json"} & set(os.listdir(dist_info))  # pip's own
    assert (venv / "bin/tmaguard").read_text().startswith(f"#!{venv}/bin/python\n")
    assert os.access(venv / "bin/tmaguard", os.X_OK)
    first = tree(venv)
    again = tmaguard("inject", "--venv", venv, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert tree(venv) == first  # a second run changes nothing


@pytest.mark.long
def test_from_a_wheel_it_places_what_pip_places(tmp_path: Path, release) -> None:
    """pip itself installs the release wheel into one venv, `tmaguard inject --wheel --venv` into another: the
    same files with the same bytes (but what only pip writes: INSTALLER, REQUESTED, direct_url.json and their
    RECORD rows), the same console script but for its venv's path; and pip uninstalls ours completely."""
    wheel = release.wheels["x86_64"]
    by_pip, by_us = make_venv(tmp_path / "pip"), make_venv(tmp_path / "ours")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python"]
    installed = subprocess.run(
        [*pip, by_pip / "bin/python", "install", "--no-deps", "--no-index", "--no-compile", "-q", wheel],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    done = tmaguard("inject", "--wheel", wheel, "--venv", by_us, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"from {wheel}" in done.stdout

    def comparable(venv: Path) -> tuple[dict[str, bytes], list[str]]:
        placed = {**tree(site_packages(venv)), "bin/tmaguard": (venv / "bin/tmaguard").read_bytes()}
        files = {k: v.replace(str(venv).encode(), b"VENV") for k, v in placed.items()}
        (record,) = [k for k in files if k.endswith(".dist-info/RECORD")]
        pip_only = ("INSTALLER", "REQUESTED", "direct_url.json")
        rows = files.pop(record).decode().splitlines()
        rows = [r for r in rows if not r.split(",")[0].endswith(pip_only) and not r.startswith("../")]
        kept = {k: v for k, v in files.items() if not k.endswith(pip_only) and "__pycache__" not in k}
        return kept, sorted(rows)

    ours, theirs = comparable(by_us), comparable(by_pip)
    assert ours == theirs
    assert {"vllm_tmaguard.pth", "vllm_tmaguard/lib/libtmaguard_overlay.so", "bin/tmaguard"} <= set(ours[0])
    assert len(ours[1]) == len(ours[0])  # a RECORD row for each file, RECORD itself in the script's place
    assert probe(by_us / "bin/python")["armed"] == ["vllm_tmaguard._import_hook"]
    removed = subprocess.run(
        [*pip, by_us / "bin/python", "uninstall", "-y", "vllm-tmaguard"], capture_output=True, text=True,
        timeout=600,
    )
    assert removed.returncode == 0, removed.stderr
    assert not [k for k in tree(by_us) if "tmaguard" in k]  # its RECORD named every file placed


def test_what_is_not_a_venv_or_cannot_be_told_is_refused_and_nothing_written(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    (plain / "lib/python3.12/site-packages").mkdir(parents=True)
    done = tmaguard("inject", "--venv", plain, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"tmaguard inject: {plain}: refused: {plain}: not a virtual environment: no pyvenv.cfg in it (a "
        "pyvenv.cfg with a `home = ...` line, bin/python and lib/pythonX.Y/site-packages beside it)"
    ), done.stderr
    assert tree(plain) == {}

    venv = make_venv(tmp_path / "two")
    site = site_packages(venv)
    (venv / "lib/python3.99/site-packages").mkdir(parents=True)  # a stale one beside, and no version said
    config = venv / "pyvenv.cfg"
    lines = config.read_text().splitlines()
    config.write_text("".join(f"{line}\n" for line in lines if not line.startswith("version")))
    before = tree(venv)
    done = tmaguard("inject", "--venv", venv, cwd=tmp_path)
    assert done.returncode == 1 and "more than one site-packages" in done.stderr, done.stderr
    assert f"(lib/{site.parent.name}/site-packages, lib/python3.99/site-packages)" in done.stderr
    assert tree(venv) == before

    other = make_venv(tmp_path / "other")
    (site_packages(other) / "vllm_tmaguard-0.0.1.dist-info").mkdir()  # another version, installed by pip
    before = tree(other)
    done = tmaguard("inject", "--venv", other, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "holds another install of vllm-tmaguard (vllm_tmaguard-0.0.1.dist-info): uninstall" in done.stderr
    assert tree(other) == before

    for args in (["inject"], ["inject", tmp_path / "dir", "--venv", venv]):  # one place, not none or two
        done = tmaguard(*args, cwd=tmp_path)
        assert done.returncode == 2 and "name one place: DIR (for PYTHONPATH) or --venv VENV" in done.stderr
    assert not (tmp_path / "dir").exists()
