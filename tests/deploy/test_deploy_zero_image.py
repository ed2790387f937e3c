"""The zero-image install (deploy/k8s/overlays/vcuda-stock-image): the init container the overlay renders,
run as the kubelet would run it (its command and arguments verbatim, in a Python that has vLLM and not this
package, the ConfigMap volume laid out from the rendered binaryData, no network), places the package exactly
as `tmaguard inject` does from a pip install of the same wheel; then vLLM starts on the emulated vCUDA pod
with the overlay loaded, deciding and recording as that pip install does (tests/test_no_rebuild.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml
from deploykit import DEPLOY, find, render, vllm_container
from test_guard_vllm import RESOLVE_PLATFORM
from test_inject_venv import PROBE
from test_no_rebuild import _decisions

from vllm_tmaguard.install.manifests import postrender, stream, zero_image

OVERLAY = "overlays/vcuda-stock-image"
# What pip writes into a dist-info that a wheel does not hold (and its RECORD, which pip rewrites).
PIP_ONLY = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")


def _pod(rendered) -> tuple[dict, dict, dict]:
    objects = rendered[OVERLAY]
    pod = find(objects, "Deployment", "vllm")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    return pod, init, vllm_container(objects)


def test_the_overlay_adds_what_tmaguard_manifests_adds(rendered) -> None:
    """One install, two writers: the overlay's hand-written patch and the post-renderer's code agree."""
    pod, init, vllm = _pod(rendered)
    # Its pin's place (wheel-pin.yaml) as the repository holds it: empty, no pin, until `wheel-configmap
    # --into` writes the wheel's digest there (test_wheel_configmap_into_the_overlay_pins_its_init_container).
    assert init == {**zero_image.init_container(vllm), "env": [zero_image.pin_variable(())]}
    assert (DEPLOY / "k8s" / OVERLAY / zero_image.OVERLAY_PIN).read_text() == zero_image.overlay_pin_patch(())
    wheel_volume = next(v for v in pod["volumes"] if v["name"] == zero_image.WHEEL_VOLUME)
    assert [v for v in pod["volumes"] if v["name"].startswith("tmaguard-")][-2:] == zero_image.volumes(
        wheel_volume["configMap"]["name"]
    )
    assert wheel_volume["configMap"]["name"].startswith(zero_image.WHEEL_CONFIGMAP + "-")  # kustomize's hash
    assert {"name": "PYTHONPATH", "value": zero_image.PACKAGE_DIR} in vllm["env"]
    assert {"name": zero_image.PACKAGE_VOLUME, "mountPath": zero_image.PACKAGE_DIR, "readOnly": True} in vllm[
        "volumeMounts"
    ]


def _configmap_volume(configmap: dict, where: Path) -> Path:
    """The ConfigMap's keys as kubelet's atomic writer lays them out: ..data -> a timestamped directory,
    each key a link into ..data; read-only, root's."""
    stamped = where / "..2026_01_01_00_00_00.000000001"
    stamped.mkdir(parents=True)
    for key, value in configmap.get("binaryData", {}).items():
        (stamped / key).write_bytes(base64.b64decode(value))
        (stamped / key).chmod(0o644)
        (where / key).symlink_to(f"..data/{key}")
    (where / "..data").symlink_to(stamped.name)
    return where


def run_init_container(
    init: dict, wheel_source: Path, package: Path, python_bin: Path
) -> subprocess.CompletedProcess[str]:
    """The init container's command and arguments verbatim, its two volumes bind-mounted at their mount
    paths (the wheel's read-only) in a private mount namespace, and no network (unshare -n): only the bytes
    in the ConfigMap volume can be used."""
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    wheel_dir, package_dir = mounts[zero_image.WHEEL_VOLUME], mounts[zero_image.PACKAGE_VOLUME]
    assert {os.path.dirname(wheel_dir), os.path.dirname(package_dir)} == {"/opt"}
    script = (
        'set -e; mount --make-rprivate /; mount -t tmpfs tmpfs /opt; mkdir -p "$3" "$4"; '
        'mount --bind "$1" "$3"; mount -o remount,bind,ro "$3"; mount --bind "$2" "$4"; shift 4; exec "$@"'
    )
    env = {"PATH": f"{python_bin}:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    env |= {e["name"]: e["value"] for e in init.get("env", [])}  # as the kubelet sets the container's own
    command = [*init["command"], *init["args"]]
    return subprocess.run(
        [
            "unshare",
            "-m",
            "-n",
            "sh",
            "-c",
            script,
            "sh",
            wheel_source,
            package,
            wheel_dir,
            package_dir,
            *command,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def pip_installed(tmp_path_factory, release) -> Path:
    """A Python with vLLM and this test environment's other packages, and the release wheel installed by pip
    (what deploy/Dockerfile does to the vLLM image): the Python to compare the zero-image install with."""
    root = tmp_path_factory.mktemp("pip-installed")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout.strip()
    )  # fmt: skip
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith("vllm_tmaguard"):
            (site / entry.name).symlink_to(entry)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q",
         release.wheels["x86_64"]],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return python


@pytest.fixture(scope="module")
def placed(rendered, stock_python, tmp_path_factory) -> Path:
    """What the overlay's init container placed, from the rendered ConfigMap alone."""
    pod, init, _ = _pod(rendered)
    work = tmp_path_factory.mktemp("zero-image")
    volume = next(v for v in pod["volumes"] if v["name"] == zero_image.WHEEL_VOLUME)
    configmap = find(rendered[OVERLAY], "ConfigMap", volume["configMap"]["name"])
    wheels = _configmap_volume(configmap, work / "configmap")
    package = work / "emptydir"
    package.mkdir()
    package.chmod(0o777)  # as kubelet makes an emptyDir
    done = run_init_container(init, wheels, package, Path(stock_python).parent)
    assert done.returncode == 0, done.stderr
    assert "placed" in done.stdout and "made 0755" in done.stdout, done.stdout
    return package


def test_the_init_container_places_the_package_as_tmaguard_inject_does(
    placed, pip_installed, tmp_path
) -> None:
    injected = tmp_path / "injected"
    done = subprocess.run(
        [pip_installed, "-m", "vllm_tmaguard", "inject", injected],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    theirs, ours = _tree(injected), _tree(placed)
    dist_info = next(name.split("/")[0] for name in ours if name.endswith(".dist-info/METADATA"))
    pip_only = {f"{dist_info}/{name}" for name in PIP_ONLY}
    assert {k: v for k, v in ours.items() if k not in pip_only} == {
        k: v for k, v in theirs.items() if k not in pip_only
    }
    assert {
        "sitecustomize.py",
        "vllm_tmaguard/lib/libtmaguard_overlay.so",
        f"{dist_info}/entry_points.txt",
    } <= set(ours)
    assert (
        stat.S_IMODE(placed.stat().st_mode) == 0o755
    )  # kubelet's 0777 tightened: nobody else may replace it


def test_vllm_starts_on_the_vcuda_pod_with_the_overlay_loaded(
    rendered, placed, pip_installed, pods, run_python, stock_python
) -> None:
    _, _, vllm = _pod(rendered)
    assert {"name": "PYTHONPATH", "value": zero_image.PACKAGE_DIR} in vllm["env"]
    pod = pods("vcuda")
    run = run_python(pod, RESOLVE_PLATFORM, {"PYTHONPATH": str(placed)}, python=stock_python, records="zero")
    pip = run_python(pod, RESOLVE_PLATFORM, python=str(pip_installed), records="pip")
    assert "error" not in run.result, run.result
    assert run.result == pip.result
    record = run.last_record()
    assert record["trigger"] == "import-hook"  # armed at interpreter start by the placed sitecustomize.py
    assert "load-overlay" in [a["kind"] for a in record["actions"]]
    assert _decisions(run) == _decisions(pip)


def test_a_wheel_for_another_machine_is_refused_by_name(rendered, release, stock_python, tmp_path) -> None:
    """An aarch64 wheel in the ConfigMap of an x86_64 node: the init container fails, saying so (its exit
    status and message: kubectl describe pod shows them)."""
    _, init, _ = _pod(rendered)
    wheels = tmp_path / "configmap"
    wheels.mkdir()
    (wheels / "vllm-tmaguard.whl").write_bytes(release.wheels["aarch64"].read_bytes())
    package = tmp_path / "emptydir"
    package.mkdir()
    done = run_init_container(init, wheels, package, Path(stock_python).parent)
    assert done.returncode == 1, done.stderr
    assert "no vllm-tmaguard wheel for x86_64" in done.stderr and "(aarch64)" in done.stderr
    assert list(package.iterdir()) == []


TMAGUARD = str(Path(sys.executable).parent / "tmaguard")


def test_wheel_configmap_prints_the_configmap_the_post_renderer_mounts(release, tmp_path) -> None:
    """`tmaguard wheel-configmap dist/*.whl | kubectl apply --server-side -f -`: both wheels under their file
    names, valid against the Kubernetes schemas, and what the init container reads back is the wheel."""
    wheels = [str(release.wheels[arch]) for arch in ("x86_64", "aarch64")]
    done = subprocess.run([TMAGUARD, "wheel-configmap", *wheels], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pin = ",".join(sorted(hashlib.sha256(Path(w).read_bytes()).hexdigest() for w in wheels))
    assert done.stderr.strip().endswith(f"TMAGUARD_WHEEL_SHA256={pin}")  # for the init container's env
    (document,) = list(yaml.safe_load_all(done.stdout))
    assert document["metadata"]["name"] == zero_image.WHEEL_CONFIGMAP
    assert render.schema_problems(document) == []
    assert {k: base64.b64decode(v) for k, v in document["binaryData"].items()} == {
        Path(w).name: Path(w).read_bytes() for w in wheels
    }
    layout = _configmap_volume(document, tmp_path / "volume")
    from vllm_tmaguard.install import wheel

    assert wheel.for_this_machine(str(layout), "aarch64").path.endswith("aarch64.whl")


def test_wheel_configmap_into_the_overlay_pins_its_init_container(release, stock_python, tmp_path) -> None:
    """Issue 34: the overlay had no place for the pin that wheel-configmap prints. `tmaguard wheel-configmap
    WHEEL --into` the overlay writes the wheel and its pin there (wheel-pin.yaml); the overlay then renders
    the init container `tmaguard manifests --wheel WHEEL` adds: pinned to that wheel. Run as the kubelet
    runs it on the ConfigMap the overlay renders, it places the package; the same ConfigMap holding a forged
    wheel instead, it refuses it by the pin."""
    k8s = tmp_path / "k8s"
    shutil.copytree(DEPLOY / "k8s", k8s, ignore=shutil.ignore_patterns("*.whl"))
    overlay = k8s / OVERLAY
    genuine = release.wheels["x86_64"]
    done = subprocess.run(
        [TMAGUARD, "wheel-configmap", str(genuine), "--into", str(overlay)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    digest = hashlib.sha256(genuine.read_bytes()).hexdigest()
    assert done.stderr.strip().endswith(f"TMAGUARD_WHEEL_SHA256={digest}")
    assert f"pinned in {overlay / 'wheel-pin.yaml'}" in done.stdout, done.stdout
    objects = render.build(overlay)
    (init,) = find(objects, "Deployment", "vllm")["spec"]["template"]["spec"]["initContainers"]
    assert init == zero_image.init_container(vllm_container(objects), (digest,))
    assert init["env"] == [{"name": "TMAGUARD_WHEEL_SHA256", "value": digest}]

    pod = find(objects, "Deployment", "vllm")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == zero_image.WHEEL_VOLUME)
    configmap = find(objects, "ConfigMap", volume["configMap"]["name"])
    forged = _forged(genuine, tmp_path / "forged.whl", tmp_path / "forged-code-ran")
    for case in ("genuine", "forged"):
        wheels = _configmap_volume(configmap, tmp_path / case / "configmap")
        if case == "forged":  # the ConfigMap edited after the pin was written
            (wheels / zero_image.OVERLAY_WHEEL).resolve().write_bytes(forged.read_bytes())
        package = tmp_path / case / "emptydir"
        package.mkdir(mode=0o777)
        ran = run_init_container(init, wheels, package, Path(stock_python).parent)
        if case == "genuine":
            assert ran.returncode == 0, ran.stderr
            assert (package / "vllm_tmaguard/lib/libtmaguard_overlay.so").is_file()
        else:
            assert ran.returncode == 1, ran.stderr
            assert "is not one that TMAGUARD_WHEEL_SHA256 pins" in ran.stderr, ran.stderr
            assert list(package.iterdir()) == [] and not (tmp_path / "forged-code-ran").exists()


def test_a_wheel_its_record_does_not_vouch_for_is_refused(release, tmp_path) -> None:
    """A byte changed in one member (the overlay library): RECORD's hash no longer matches; nothing is placed
    from it, by the init container's command or by wheel-configmap."""
    tampered = tmp_path / "vllm-tmaguard.whl"
    with zipfile.ZipFile(release.wheels["x86_64"]) as source, zipfile.ZipFile(tampered, "w") as out:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("libtmaguard_overlay.so"):
                data = data[:-1] + bytes([data[-1] ^ 1])
            out.writestr(info, data)
    for command in (
        ["inject", "--wheel", str(tampered), str(tmp_path / "placed")],
        ["wheel-configmap", str(tampered)],
    ):
        done = subprocess.run([TMAGUARD, *command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        assert "libtmaguard_overlay.so does not match its RECORD hash" in done.stderr and done.stdout == ""
    assert not (tmp_path / "placed").exists() or list((tmp_path / "placed").iterdir()) == []
    two = subprocess.run(
        [TMAGUARD, "wheel-configmap", *map(str, release.wheels.values()), "--into", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert two.returncode == 2 and "--into takes one wheel" in two.stderr


def _forged(genuine: Path, out: Path, marker: Path) -> Path:
    """`genuine` with code added to its __main__ (it leaves `marker` behind) and its RECORD rewritten to vouch
    for it: what someone who can edit the wheel ConfigMap can make, and RECORD cannot catch."""
    with zipfile.ZipFile(genuine) as source:
        infos = source.infolist()
        contents = {info.filename: source.read(info) for info in infos}
    main = "vllm_tmaguard/__main__.py"
    contents[main] += f"\nopen({str(marker)!r}, 'w').write('forged code ran')\n".encode()  # runs at import
    record = next(name for name in contents if name.endswith(".dist-info/RECORD"))
    rows = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for name, data in contents.items()
        if name != record
    ]
    contents[record] = ("\n".join([*rows, f"{record},,"]) + "\n").encode()
    with zipfile.ZipFile(out, "w") as forged:
        for info in infos:
            forged.writestr(info, contents[info.filename])
    return out


def test_a_pinned_init_container_refuses_a_forged_wheel(rendered, release, stock_python, tmp_path) -> None:
    """`tmaguard manifests --wheel` pins the init container to the wheels' sha256: a wheel ConfigMap edited
    afterwards (a forged wheel whose RECORD vouches for it) runs none of its code and places nothing, whether
    it is the wheel the bootstrap imports or the one `inject` places; the pinned wheels are placed."""
    from vllm_tmaguard.install import wheel

    genuine, other = release.wheels["x86_64"], release.wheels["aarch64"]
    objects = [
        o for o in rendered[OVERLAY] if o["kind"] != "ConfigMap" or "wheel" not in o["metadata"]["name"]
    ]
    text = "".join("---\n" + yaml.safe_dump(o) for o in objects)
    done = subprocess.run(
        [TMAGUARD, "manifests", "--container", "vllm", "--wheel", str(genuine), "--wheel", str(other)],
        input=text, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    deployment = find(list(yaml.safe_load_all(done.stdout)), "Deployment", "vllm")
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    digests = sorted(hashlib.sha256(w.read_bytes()).hexdigest() for w in (genuine, other))
    assert init["env"] == [{"name": wheel.PIN_VARIABLE, "value": ",".join(digests)}]

    marker = tmp_path / "forged-code-ran"
    forged = _forged(genuine, tmp_path / "forged.whl", marker)
    assert wheel.read(str(forged)).data == forged.read_bytes()  # its RECORD holds: only the pin catches it
    python_bin = Path(stock_python).parent
    cases = {  # the ConfigMap's files: the bootstrap imports the first by name, inject places the x86_64 one
        "imported": {"a.whl": forged, "b.whl": other},
        "placed": {"a.whl": other, "b.whl": forged},
        "genuine": {"a.whl": other, "b.whl": genuine},
    }
    for case, layout in cases.items():
        volume, package = tmp_path / case / "configmap", tmp_path / case / "emptydir"
        volume.mkdir(parents=True)
        package.mkdir(mode=0o777)
        for name, source in layout.items():
            (volume / name).write_bytes(source.read_bytes())
        ran = run_init_container(init, volume, package, python_bin)
        if case == "genuine":
            assert ran.returncode == 0, ran.stderr
            assert (package / "vllm_tmaguard/lib/libtmaguard_overlay.so").is_file()
            continue
        assert ran.returncode == 1, (case, ran.stderr)
        forged_digest = hashlib.sha256(forged.read_bytes()).hexdigest()
        assert f"its sha256 {forged_digest} is not one that {wheel.PIN_VARIABLE} pins" in ran.stderr, case
        assert list(package.iterdir()) == [] and not marker.exists(), case


def test_a_pin_that_is_no_digest_is_refused_by_name(release, tmp_path) -> None:
    env = {**os.environ, "TMAGUARD_WHEEL_SHA256": "sha256:abc"}
    done = subprocess.run(
        [TMAGUARD, "inject", "--wheel", str(release.wheels["x86_64"]), str(tmp_path / "placed")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "TMAGUARD_WHEEL_SHA256='sha256:abc' is not valid; allowed: sha256 digests" in done.stderr
    assert not (tmp_path / "placed").exists()


def _in_opt(mounts: dict[str, tuple[Path, bool]], command: list[str], env: dict[str, str]) -> str:
    """`command` as a container of the pod would run it: a private mount namespace, no network, /opt a fresh
    tmpfs holding `mounts` ({path under /opt: (what is bound there, read-only)}), the image's venv among them.
    Its stdout; fails with its stderr."""
    script, places = "set -e; mount --make-rprivate /; mount -t tmpfs tmpfs /opt; ", []
    for target, (source, read_only) in mounts.items():
        script += 'mkdir -p "$2"; mount --bind "$1" "$2"; '
        script += 'mount -o remount,bind,ro "$2"; shift 2; ' if read_only else "shift 2; "
        places += [str(source), target]
    done = subprocess.run(
        ["unshare", "-m", "-n", "sh", "-c", script + 'exec "$@"', "sh", *places, *command],
        env=env, capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_llm_d_venv_runs_the_init_container_and_reads_the_package(release, stock_python, tmp_path) -> None:
    """llm-d's shape (vLLM in the image's venv at /opt/vllm, which the container's command activates) through
    `tmaguard manifests --wheel`: the init container gets the venv's python, the guarded line says so, a
    second run changes nothing. Run verbatim with a real `python -m venv` bound at /opt/vllm (the stock image
    of these tests), the init container places the package from the ConfigMap's bytes; then the vLLM
    container's own command, up to `exec vllm serve` (a probe runs instead), activates the venv, whose python
    arms the guard at start from the sitecustomize.py on PYTHONPATH: the placement a pod's venv needs (an init
    container cannot write into the image's venv)."""
    wheel = release.wheels["x86_64"]
    wheels = {wheel.name: wheel.read_bytes()}
    text = (Path(__file__).resolve().parent / "shapes/lws-llm-d.yaml").read_text()
    result = postrender.postrender(text, (), wheels)
    assert not result.refused and postrender.postrender(result.text, (), wheels).text == result.text
    assert result.guarded == [
        "LeaderWorkerSet/wide-ep-decode spec.leaderWorkerTemplate.workerTemplate.spec: vllm-worker "
        "(tmaguard-inject runs `/opt/vllm/bin/python3`, the venv /opt/vllm its command activates)"
    ]
    lws, configmap = (d.value for d in stream.split(result.text))
    pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    init, vllm = pod["initContainers"][0], pod["containers"][0]
    assert init["command"][0] == "/opt/vllm/bin/python3"

    venv = Path(stock_python).parent.parent
    package = tmp_path / "emptydir"
    package.mkdir()
    package.chmod(0o777)  # as kubelet makes an emptyDir
    base = {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    volumes = {zero_image.WHEEL_DIR: (_configmap_volume(configmap, tmp_path / "configmap"), True)}
    placed = _in_opt(
        {"/opt/vllm": (venv, True), **volumes, zero_image.PACKAGE_DIR: (package, False)},
        [*init["command"], *init["args"]],
        base | {e["name"]: e["value"] for e in init["env"]},  # the wheel's pin among them
    )
    assert f"from {zero_image.WHEEL_DIR}/{wheel.name}" in placed, placed

    script = vllm["args"][0].split("exec vllm serve")[0] + 'exec python3 -c "$PROBE"'
    assert script.startswith("source /opt/vllm/bin/activate\n")
    env = base | {e["name"]: e["value"] for e in vllm["env"]} | {"PROBE": PROBE}
    assert env["PYTHONPATH"] == zero_image.PACKAGE_DIR
    found = json.loads(_in_opt({"/opt/vllm": (venv, True), zero_image.PACKAGE_DIR: (package, True)},
                               [*vllm["command"], script], env))  # fmt: skip
    assert found["venv"] and found["armed"] == ["vllm_tmaguard._import_hook"], found
    assert found["hook"] == f"{zero_image.PACKAGE_DIR}/vllm_tmaguard/_import_hook.py"
    assert found["sitecustomize"] == f"{zero_image.PACKAGE_DIR}/sitecustomize.py"
    assert "vllm_tmaguard.plugin:platform_plugin" in found["plugins"]
