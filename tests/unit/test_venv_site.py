"""`tmaguard inject --venv`: which site-packages a virtual environment's python reads, told from its files
alone (pyvenv.cfg, lib/), what is refused (not a venv, or one whose site-packages cannot be told), and what
pip would write there beside the package's files (the RECORD, the console script). The real venv, its python
reading the .pth, and the comparison with pip itself: tests/test_inject_venv.py."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
from pathlib import Path

import pytest

from vllm_tmaguard.install import inject, venv
from vllm_tmaguard.install.venv import VenvError, choose_site

VENV_CFG = "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.12.3\n"  # python -m venv
UV_CFG = "home = /usr/bin\nimplementation = CPython\nuv = 0.8.15\nversion_info = 3.12.11\nprompt = vllm\n"
VIRTUALENV_CFG = "home = /usr/bin\nimplementation = CPython\nversion_info = 3.11.7.final.0\nvirtualenv = 20\n"


@pytest.mark.parametrize(
    ("config", "entries", "chosen"),
    [
        (VENV_CFG, ["python3.12"], "python3.12"),
        (UV_CFG, ["python3.12"], "python3.12"),
        (VIRTUALENV_CFG, ["python3.11"], "python3.11"),
        (VENV_CFG, ["python3.11", "python3.12"], "python3.12"),  # a stale one beside: the cfg's version picks
        ("home = /usr/bin\nversion = 3.13.1\n", ["python3.13t"], "python3.13t"),  # free-threaded build
        ("home = /opt/pypy/bin\nversion_info = 3.10.14\n", ["pypy3.10"], "pypy3.10"),
        ("home = /usr/bin\n", ["python3.12"], "python3.12"),  # no version: the only one
        ("Home = /usr/bin\nVERSION = 3.12.0\nnot a key line\n", ["python3.12", "python3.9"], "python3.12"),
    ],
)  # fmt: skip
def test_the_site_packages_its_python_reads(config: str, entries: list[str], chosen: str) -> None:
    assert choose_site("/opt/vllm", venv.parse_config(config), entries) == chosen


@pytest.mark.parametrize(
    ("config", "entries", "said"),
    [
        ("", ["python3.12"], "/opt/vllm: not a virtual environment: its pyvenv.cfg has no `home = ...`"),
        ("include-system-site-packages = false\n", ["python3.12"], "has no `home = ...`"),
        (VENV_CFG, [], "/opt/vllm: not a virtual environment: no lib/pythonX.Y/site-packages"),
        (VENV_CFG, ["site-packages", "pkgconfig"], "no lib/pythonX.Y/site-packages"),
        (VENV_CFG, ["python3.11"], "/opt/vllm: its pyvenv.cfg says Python 3.12.3, but there is no "
                                   "lib/python3.12/site-packages (found: lib/python3.11/site-packages)"),
        ("home = /usr/bin\n", ["python3.11", "python3.12"],
         "/opt/vllm: more than one site-packages (lib/python3.11/site-packages, lib/python3.12/"),
        ("home = /usr/bin\nversion = 3.13.1\n", ["python3.13", "python3.13t"], "more than one site-packages"),
    ],
)  # fmt: skip
def test_what_cannot_be_told_is_refused_naming_it(config: str, entries: list[str], said: str) -> None:
    with pytest.raises(VenvError) as refused:
        choose_site("/opt/vllm", venv.parse_config(config), entries)
    assert said in str(refused.value)
    if "not a virtual environment" in said:  # and what a venv has
        assert "pyvenv.cfg with a `home = ...` line, bin/python and lib/pythonX.Y/site-packages" in str(
            refused.value
        )


def _venv(root: Path, config: str = VENV_CFG, version: str = "python3.12") -> Path:
    (root / "lib" / version / "site-packages").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to("/bin/sh")
    (root / "pyvenv.cfg").write_text(config)
    return root


def test_find_reads_the_venvs_files(tmp_path: Path) -> None:
    found = venv.find(str(_venv(tmp_path / "v")))
    assert found.site_packages == str(tmp_path / "v/lib/python3.12/site-packages")
    assert found.bin == str(tmp_path / "v/bin") and found.python == str(tmp_path / "v/bin/python")


def test_find_refuses_what_is_not_a_venv(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    (plain / "lib/python3.12/site-packages").mkdir(parents=True)  # site-packages but no pyvenv.cfg
    with pytest.raises(VenvError, match=f"^{plain}: not a virtual environment: no pyvenv.cfg in it"):
        venv.find(str(plain))
    with pytest.raises(VenvError, match="not a virtual environment: not a directory"):
        venv.find(str(tmp_path / "absent"))
    real = _venv(tmp_path / "v")
    with pytest.raises(VenvError, match=f"not a directory \\(name the environment's directory, {real}\\)"):
        venv.find(str(real / "bin/python"))  # its python named instead of the venv
    (real / "bin/python").unlink()
    with pytest.raises(VenvError, match="no bin/python"):
        venv.find(str(real))


@pytest.mark.parametrize("kind", ["directory", "fifo", "link to a fifo"])
def test_a_pyvenv_cfg_of_the_wrong_kind_is_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    root = _venv(tmp_path / "v")
    (root / "pyvenv.cfg").unlink()
    if kind == "directory":
        (root / "pyvenv.cfg").mkdir()
    else:
        os.mkfifo(tmp_path / "fifo")
        if kind == "fifo":
            (root / "pyvenv.cfg").unlink(missing_ok=True)
            os.rename(tmp_path / "fifo", root / "pyvenv.cfg")
        else:
            (root / "pyvenv.cfg").symlink_to(tmp_path / "fifo")
    with pytest.raises(VenvError, match=f"^{root}/pyvenv.cfg: not a venv's pyvenv.cfg"):
        venv.find(str(root))


def test_another_install_of_the_package_is_told() -> None:
    ours = "vllm_tmaguard-0.2.0.dist-info"
    names = [
        ours, "vllm_tmaguard", "vllm_tmaguard.pth", "vllm", "vllm-0.32.0.dist-info",
        "vllm_tmaguard_x-1.dist-info", "vllm_tmaguard-0.1.0.dist-info", "vllm_tmaguard-0.0.1-py3.12.egg-info",
        "__editable__.vllm_tmaguard-0.2.0.pth", "__editable___vllm_tmaguard_0_2_0_finder.py",
        "__editable__.x.pth",
    ]  # fmt: skip
    assert venv.others_installed(names, ours) == [
        "__editable__.vllm_tmaguard-0.2.0.pth", "__editable___vllm_tmaguard_0_2_0_finder.py",
        "vllm_tmaguard-0.0.1-py3.12.egg-info", "vllm_tmaguard-0.1.0.dist-info",
    ]  # fmt: skip
    assert venv.others_installed(["vllm_tmaguard-0.2.0.dist-info", "vllm_tmaguard"], ours) == []


def test_console_scripts_and_the_record() -> None:
    entry_points = (
        "[console_scripts]\ntmaguard = vllm_tmaguard.__main__:main\nTm-X = a.b:c [extra]\n\n"
        "[vllm.platform_plugins]\ntmaguard = vllm_tmaguard.plugin:platform_plugin\n"
    )
    assert venv.console_scripts(entry_points) == {
        "tmaguard": ("vllm_tmaguard.__main__", "main"),
        "Tm-X": ("a.b", "c"),
    }
    assert venv.console_scripts("[vllm.general_plugins]\nx = a:b\n") == {}
    odd = "[console_scripts]\n../x = a:b\n.x = a:b\nx/y = a:b\nok = a:b()\nok2 = a b:c\nok3 = a:b;c\n"
    assert venv.console_scripts(odd) == {}  # no file outside bin/, no code in the script's import line
    script = venv.script("/opt/vllm/bin/python", "vllm_tmaguard.__main__", "main").decode()
    assert script.startswith("#!/opt/vllm/bin/python\n")
    assert "from vllm_tmaguard.__main__ import main\n" in script
    written = [("vllm_tmaguard/__init__.py", b"x = 1\n"), ("../../../bin/tmaguard", script.encode())]
    rows = list(csv.reader(io.StringIO(venv.record(written, "d.dist-info/RECORD").decode())))
    assert rows[-1] == ["d.dist-info/RECORD", "", ""]
    for path, digest, size in rows[:-1]:
        data = dict(written)[path]
        expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert (digest, int(size)) == (f"sha256={expected}", len(data))
    assert [r[0] for r in rows[:-1]] == sorted(dict(written))


def test_pythonpath_gets_no_pth_and_a_sitecustomize() -> None:
    entries = [("vllm_tmaguard.pth", b"import x", 0o644), ("vllm_tmaguard/a.pth", b"", 0o644)]
    placed = inject.for_pythonpath(entries)
    assert [e[0] for e in placed] == ["vllm_tmaguard/a.pth", "sitecustomize.py"]
