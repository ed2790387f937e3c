"""`tmaguard inject DIR` (the stock-image install, an init container's command, usually root) against links
planted where it writes (issue 25, item 5). DIR is a volume: kubelet makes an emptyDir root's and 0777, so a
co-tenant (another uid in the pod) may have put links or its own subdirectories there first. At 1cc570e
inject copied the package with shutil.copy2, through any link in its way: a root-owned file was overwritten.
Now every file goes through the door's install writes (stages/door.py's install_file): a link in a file's
place is replaced (a new file renamed over it), a directory on the way is opened without following a link
and must be root's or this user's and closed to others, else inject refuses with the path and why; nothing
is written through a link either way."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from advkit_a import TMAGUARD, fresh_uids, own, snapshot
from podkit import scrubbed_environ

import vllm_tmaguard

VICTIM_DATA = b"root's own file: nobody may overwrite it through a link\n"


def _inject(target: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TMAGUARD, "inject", str(target)], env=scrubbed_environ(), cwd=target.parent,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _victim(path: Path) -> Path:
    path.write_bytes(VICTIM_DATA)
    path.chmod(0o644)
    return path


def _distribution() -> metadata.Distribution:
    """The installed distribution whose files are the package this Python imports (what inject copies)."""
    init = Path(vllm_tmaguard.__file__).resolve()
    candidates = [d for d in metadata.distributions(name="vllm-tmaguard") if d.files]
    (found,) = [
        d for d in candidates if Path(str(d.locate_file("vllm_tmaguard/__init__.py"))).resolve() == init
    ]
    return found


def _installed(relative: str) -> bytes:
    """A file of the installed distribution, as inject copies it."""
    return Path(str(_distribution().locate_file(relative))).read_bytes()


def _dist_info() -> str:
    return next(str(f) for f in _distribution().files or () if str(f).endswith(".dist-info/METADATA"))


def test_inject_replaces_links_in_its_own_directories(tmp_path: Path) -> None:
    """Item 5: DIR and DIR/vllm_tmaguard are root's (a previous inject, or the image), but
    vllm_tmaguard/__init__.py, the dist-info's METADATA and sitecustomize.py are links to root-owned files
    elsewhere. At 1cc570e inject wrote the package's files through them (the targets overwritten). Now each
    link is replaced by the file itself; the targets are unchanged."""
    target = tmp_path / "opt-vllm-tmaguard"
    metadata_file = _dist_info()
    victims = {name: _victim(tmp_path / f"victim-{i}") for i, name in
               enumerate(["vllm_tmaguard/__init__.py", metadata_file, "sitecustomize.py"])}  # fmt: skip
    for relative, victim in victims.items():
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        (target / relative).symlink_to(victim)
    done = _inject(target)
    assert [v.read_bytes() for v in victims.values()] == [VICTIM_DATA] * 3, "inject wrote through a link"
    assert done.returncode == 0, done.stderr
    for relative in victims:
        assert not (target / relative).is_symlink() and (target / relative).is_file(), relative
    assert (target / "vllm_tmaguard/__init__.py").read_bytes() == _installed("vllm_tmaguard/__init__.py")
    assert (target / metadata_file).read_bytes() == _installed(metadata_file)
    assert b"vllm_tmaguard._import_hook" in (target / "sitecustomize.py").read_bytes()


@pytest.mark.parametrize("planted", ["subdirectory", "subdirectory link", "the volume itself"])
def test_inject_refuses_what_a_co_tenant_planted(tmp_path: Path, planted: str) -> None:
    """Item 5: a co-tenant M got to the volume first. "subdirectory": DIR is root's emptyDir (0777) and M made
    DIR/vllm_tmaguard (M's, 0777) holding __init__.py as a link to a root-owned file; "subdirectory link":
    DIR/vllm_tmaguard is M's link to a root-owned directory; "the volume itself": DIR is M's (0777) with
    those links. M's sitecustomize.py links to a root-owned file too. At 1cc570e inject (as root) wrote
    through all of them. Now it refuses (exit status 1) naming the path and why, the root-owned files and
    directory are unchanged, and nothing is written into M's directory, nor anywhere in DIR."""
    victim = _victim(tmp_path / "victim")
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    _victim(victim_dir / "__init__.py")
    target = tmp_path / "volume"
    target.mkdir()
    target.chmod(0o777)
    with fresh_uids(1) as (attacker,):
        if planted == "the volume itself":
            own(target, attacker, 0o777)
        package = target / "vllm_tmaguard"
        if planted == "subdirectory link":
            package.symlink_to(victim_dir)
        else:
            package.mkdir()
            own(package, attacker, 0o777)
            (package / "__init__.py").symlink_to(victim)
            own(package / "__init__.py", attacker)
        (target / "sitecustomize.py").symlink_to(victim)
        own(target / "sitecustomize.py", attacker)
        before = {"victim-dir": snapshot(victim_dir)}
        if planted != "subdirectory link":
            before["package"] = snapshot(package)
        done = _inject(target)
        assert victim.read_bytes() == VICTIM_DATA and snapshot(victim_dir) == before["victim-dir"], (
            "inject wrote through the co-tenant's link"
        )
        if "package" in before:
            assert snapshot(package) == before["package"], "inject wrote into the co-tenant's directory"
        assert done.returncode == 1, done.stdout + done.stderr
        refused = target if planted == "the volume itself" else package
        why = "is a symbolic link" if planted == "subdirectory link" else f"uid {attacker}"
        assert f"refused: {refused}" in done.stderr and why in done.stderr, done.stderr
        assert (target / "sitecustomize.py").is_symlink(), "the hook was armed in a refused install"
        # Issue 34: nothing written at all (the dist-info, checked before the package's own directory, was).
        assert sorted(os.listdir(target)) == ["sitecustomize.py", "vllm_tmaguard"], os.listdir(target)


def test_inject_into_a_world_writable_volume_of_its_own_tightens_it(tmp_path: Path) -> None:
    """Item 5 (with item 16's rule for installation directories): DIR is root's emptyDir as kubelet makes
    it (0777), empty. Inject (root) makes it 0755 before writing, so nobody else can swap the code it
    places, and says so; every directory it creates is 0755 and every file it writes is root's and closed
    to others' writes. At 1cc570e the volume stayed 0777."""
    target = tmp_path / "volume"
    target.mkdir()
    target.chmod(0o777)
    done = _inject(target)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert f"{target} was mode 0777: made 0755" in done.stdout, done.stdout
    for directory, dirs, names in os.walk(target):
        for name in [*dirs, *names]:
            info = os.lstat(os.path.join(directory, name))
            assert not stat.S_ISLNK(info.st_mode) and info.st_uid == 0 and info.st_mode & 0o022 == 0, name


def test_inject_into_a_venv_replaces_links_and_refuses_another_uids_site_packages(tmp_path: Path) -> None:
    """`inject --venv` (root, an image build) goes through the same door: links planted where it writes (the
    .pth in site-packages, the console script in bin/) are replaced, never written through; a site-packages
    another uid owns is refused by name with nothing written there or in bin/."""
    venv = tmp_path / "vllm"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    (site,) = venv.glob("lib/python3.*/site-packages")
    victims = [_victim(tmp_path / "victim-pth"), _victim(tmp_path / "victim-script")]
    (site / "vllm_tmaguard.pth").symlink_to(victims[0])
    (venv / "bin/tmaguard").symlink_to(victims[1])
    done = subprocess.run([*TMAGUARD, "inject", "--venv", str(venv)], env=scrubbed_environ(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert [v.read_bytes() for v in victims] == [VICTIM_DATA] * 2, "inject wrote through a link"
    assert done.returncode == 0, done.stderr
    for placed in (site / "vllm_tmaguard.pth", venv / "bin/tmaguard"):
        assert not placed.is_symlink() and placed.is_file(), placed

    other = tmp_path / "other"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True, timeout=300)
    (theirs,) = other.glob("lib/python3.*/site-packages")
    with fresh_uids(1) as (attacker,):
        own(theirs, attacker, 0o755)
        bin_before = sorted(os.listdir(other / "bin"))
        done = subprocess.run([*TMAGUARD, "inject", "--venv", str(other)], env=scrubbed_environ(),
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"refused: {theirs}" in done.stderr and f"uid {attacker}" in done.stderr, done.stderr
        assert os.listdir(theirs) == [] and sorted(os.listdir(other / "bin")) == bin_before
