"""deploy/render.py against the real kustomize (`kubectl kustomize`, kustomize v5 inside kubectl): every
kustomization under deploy/k8s renders to the same objects, the zero-image overlay with the wheel placed by
`tmaguard wheel-configmap --into`; kustomize's configMapGenerator names (the content hash of data and
binaryData) come out the same from vllm_tmaguard.install.manifests.configmap."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from deploykit import DEPLOY, KUSTOMIZATIONS, render

from vllm_tmaguard.install.manifests import configmap

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
TMAGUARD = str(Path(sys.executable).parent / "tmaguard")


def kubectl_kustomize(directory: Path) -> list[dict]:
    done = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def _by_id(objects: list[dict]) -> dict[tuple[str, str], dict]:
    by_id = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    assert len(by_id) == len(objects)
    return by_id


@pytest.fixture(scope="module")
def k8s_with_wheel(tmp_path_factory, release) -> Path:
    """deploy/k8s copied, the wheel placed where the zero-image overlay's generator reads it, by the command
    an operator runs."""
    k8s = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(DEPLOY / "k8s", k8s)
    overlay = k8s / "overlays/vcuda-stock-image"
    done = subprocess.run(
        [TMAGUARD, "wheel-configmap", str(release.wheels["x86_64"]), "--into", str(overlay)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {overlay}/vllm-tmaguard.whl (x86_64, vllm-tmaguard 0.1.0)")
    assert (overlay / "vllm-tmaguard.whl").read_bytes() == release.wheels["x86_64"].read_bytes()
    return k8s


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_render_py_builds_what_kubectl_kustomize_builds(k8s_with_wheel, name) -> None:
    ours = _by_id(render.build(k8s_with_wheel / name))
    theirs = _by_id(kubectl_kustomize(k8s_with_wheel / name))
    assert ours.keys() == theirs.keys()
    for key, obj in ours.items():
        assert json.dumps(obj, sort_keys=True) == json.dumps(theirs[key], sort_keys=True), key
    assert render.check(k8s_with_wheel) == []


@pytest.mark.parametrize(
    "files",
    [
        {"a.txt": b"abc\n"},
        {"short.bin": b"\xff\x00\x01"},  # base64 on one line
        {"long.bin": bytes(range(256)) * 3, "t.conf": b"x<y & z>w\n"},  # lines of 70; Go's HTML escapes
        {"exact.bin": bytes(range(150, 255))},  # 105 bytes, 140 base64 characters: two full lines
    ],
)
def test_the_generated_name_is_kustomizes(tmp_path, files) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        "configMapGenerator:\n  - name: gen\n    files: [" + ", ".join(files) + "]\n"
    )
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (theirs,) = kubectl_kustomize(tmp_path)
    (ours,) = render.build(tmp_path)
    assert ours == theirs
    text = {k: v.decode() for k, v in files.items() if not k.endswith(".bin")}
    binary = {k: configmap.kustomize_base64(v) for k, v in files.items() if k.endswith(".bin")}
    assert theirs["metadata"]["name"] == f"gen-{configmap.kustomize_hash(text, binary)}"
