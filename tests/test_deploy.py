"""deploy/: the image recipe, the Kubernetes manifests and the operator docs, checked offline.

Every kustomization under deploy/k8s is rendered (deploy/render.py: kustomize's `resources`, JSON 6902
`patches` and `images`) and every object it renders is validated against the strict Kubernetes JSON schemas
that the kubernetes-validate package ships (oldest and newest version it has); then what the schemas cannot
see: references between objects, the probes, the termination message, GPUs against tensor parallelism, the
TMAGUARD_* toggles against the code that parses them. The preflight script the container runs is executed
with stand-in commands, and once with the real `tmaguard` on an emulated vCUDA pod.
"""

from __future__ import annotations

import copy
import fnmatch
import importlib.util
import io
import json
import math
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_tmaguard.toggles import TOGGLES, ToggleError, parse_toggles

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
OPERATOR_DOC = REPO / "docs" / "operator.md"
KUSTOMIZATIONS = ("base", "overlays/hami", "overlays/vcuda")


def _load_render():
    spec = importlib.util.spec_from_file_location("deploy_render", DEPLOY / "render.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


render = _load_render()


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render.build(DEPLOY / "k8s" / name) for name in KUSTOMIZATIONS}


def find(objects: list[dict], kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} objects"
    return matches[0]


def vllm_container(objects: list[dict]) -> dict:
    pod = find(objects, "Deployment", "vllm")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "vllm")


# --- rendering and schemas ----------------------------------------------------------------------------


def test_every_kustomization_renders_and_validates_against_the_kubernetes_schemas(rendered) -> None:
    found = {str(d.relative_to(DEPLOY / "k8s")) for d in render.kustomization_dirs()}
    assert found == set(KUSTOMIZATIONS)
    for name, objects in rendered.items():
        kinds = sorted(o["kind"] for o in objects)
        assert kinds == ["ConfigMap", "ConfigMap", "ConfigMap", "Deployment", "Service"], name
        problems = [p for o in objects for p in render.schema_problems(o)]
        assert not problems, "\n".join(map(str, problems))
    assert render.check() == []  # what `python deploy/render.py check` runs: also yamllint


def _break_port(d: dict) -> None:
    vllm_container([d])["ports"][0]["containerPort"] = "8000"


def _typo_field(d: dict) -> None:
    vllm_container([d])["terminationMessagePolicys"] = "FallbackToLogsOnError"


def _no_containers(d: dict) -> None:
    del d["spec"]["template"]["spec"]["containers"]


def _bad_probe(d: dict) -> None:
    vllm_container([d])["livenessProbe"]["httpGet"]["port"] = ["http"]


def _no_selector(d: dict) -> None:
    del d["spec"]["selector"]


@pytest.mark.parametrize("breakage", [_break_port, _typo_field, _no_containers, _bad_probe, _no_selector])
def test_schema_validation_rejects_a_broken_deployment(rendered, breakage) -> None:
    deployment = copy.deepcopy(find(rendered["base"], "Deployment", "vllm"))
    assert render.schema_problems(deployment) == []
    breakage(deployment)
    problems = render.schema_problems(deployment)
    assert len(problems) == len(render.KUBERNETES_VERSIONS), problems


def test_check_fails_when_a_manifest_on_disk_is_broken(tmp_path) -> None:
    k8s = tmp_path / "k8s"
    shutil.copytree(DEPLOY / "k8s", k8s)
    deployment = k8s / "base" / "deployment.yaml"
    deployment.write_text(deployment.read_text().replace("containerPort: 8000", 'containerPort: "8000"'))
    problems = render.check(k8s)
    # Every kustomization builds on the base: each of them, under each Kubernetes version checked.
    assert len(problems) == len(KUSTOMIZATIONS) * len(render.KUBERNETES_VERSIONS), problems
    assert all("ports/0/containerPort" in p.where for p in problems), problems
    (k8s / "overlays/hami/vllm-server.yaml").write_text("- {op: replace, path: /data/NOPE, value: '2'}\n")
    assert any("overlays/hami" in p.where and "NOPE" in p.message for p in render.check(k8s))


def test_schema_validation_rejects_broken_configmap_and_service(rendered) -> None:
    toggles = copy.deepcopy(find(rendered["base"], "ConfigMap", "tmaguard-toggles"))
    toggles["data"]["TMAGUARD_STRICT"] = 1  # ConfigMap values must be strings
    assert render.schema_problems(toggles)
    service = copy.deepcopy(find(rendered["base"], "Service", "vllm-api"))
    service["apiVersion"] = "v2"
    assert render.schema_problems(service)


def test_yamllint_is_clean_and_would_catch_a_bad_file(tmp_path) -> None:
    assert render.yamllint_problems() == []
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    config = YamlLintConfig(file=str(DEPLOY / ".yamllint"))
    bad = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n    name: x \ndata: {a: yes}\n"
    found = {p.rule for p in linter.run(bad, config)}
    assert {"indentation", "trailing-spaces", "truthy"} <= found


# --- the renderer itself ---------------------------------------------------------------------------------


def _kustomization(tmp_path: Path, kustomization: str, files: dict[str, str] | None = None) -> Path:
    directory = tmp_path / "k"
    directory.mkdir()
    (directory / "kustomization.yaml").write_text(kustomization)
    shutil.copy(DEPLOY / "k8s/base/deployment.yaml", directory / "deployment.yaml")
    for name, text in (files or {}).items():
        (directory / name).write_text(text)
    return directory


TARGET = "target: {group: apps, version: v1, kind: Deployment, name: vllm}"


@pytest.mark.parametrize(
    ("kustomization", "files", "message"),
    [
        ("resources: [deployment.yaml]\nnamePrefix: x-\n", {}, "does not implement"),
        (
            "resources: [deployment.yaml]\npatches:\n  - path: p.yaml\n",
            {"p.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: vllm}\n"},
            "only JSON 6902",
        ),
        (
            "resources: [deployment.yaml]\npatches:\n  - path: p.yaml\n"
            "    target: {kind: Deployment, name: nothing}\n",
            {"p.yaml": "- {op: remove, path: /spec/replicas}\n"},
            "matches no object",
        ),
        (
            f"resources: [deployment.yaml]\npatches:\n  - path: p.yaml\n    {TARGET}\n",
            {"p.yaml": "- {op: test, path: /spec/template/spec/containers/0/name, value: other}\n"},
            "p.yaml on Deployment/vllm",
        ),
        ("resources: [deployment.yaml, deployment.yaml]\n", {}, "defined twice"),
        ("resources: [missing.yaml]\n", {}, "does not exist"),
    ],
)
def test_renderer_refuses_what_kustomize_would_not_do_the_same_way(
    tmp_path, kustomization, files, message
) -> None:
    with pytest.raises(render.RenderError, match=re.escape(message)):
        render.build(_kustomization(tmp_path, kustomization, files))


def test_renderer_applies_inline_patches_and_images(tmp_path) -> None:
    directory = _kustomization(
        tmp_path,
        "resources: [deployment.yaml]\n"
        f"patches:\n  - patch: '[{{op: replace, path: /spec/replicas, value: 3}}]'\n    {TARGET}\n"
        "images:\n  - {name: vllm-tmaguard, newName: reg:5000/team/vllm, digest: 'sha256:abc'}\n",
    )
    deployment = find(render.build(directory), "Deployment", "vllm")
    assert deployment["spec"]["replicas"] == 3
    assert vllm_container([deployment])["image"] == "reg:5000/team/vllm@sha256:abc"
    assert render.split_image("reg:5000/team/vllm:v1@sha256:x") == ("reg:5000/team/vllm", "v1", "sha256:x")
    assert render.split_image("reg:5000/vllm") == ("reg:5000/vllm", "", "")


# --- what the schemas cannot see -------------------------------------------------------------------------


def _http_port(container: dict, port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p["name"] == port)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_deployment_is_wired_as_the_docs_say(rendered, name) -> None:
    objects = rendered[name]
    deployment = find(objects, "Deployment", "vllm")
    pod = deployment["spec"]["template"]["spec"]
    container = vllm_container(objects)
    configmaps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}

    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert pod["enableServiceLinks"] is False and "initContainers" not in pod
    assert container["image"] == "registry.example.com/vllm-tmaguard:v0.32.0"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/health" and _http_port(container, get["port"]) == 8000, probe
    assert container["command"] == ["/bin/sh", "/etc/tmaguard/preflight.sh"]
    assert "--port=8000" in container["args"] and "--host=0.0.0.0" in container["args"]

    # kubelet expands $(VAR) in command and args only for variables the container defines.
    defined = {e["name"] for e in container["env"]}
    for source in container["envFrom"]:
        defined |= set(configmaps[source["configMapRef"]["name"]])
    used = {m for arg in container["command"] + container["args"] for m in re.findall(r"\$\((\w+)\)", arg)}
    assert used and used <= defined, used - defined
    for env in container["env"]:
        ref = env.get("valueFrom", {}).get("configMapKeyRef")
        if ref and not ref.get("optional"):
            assert ref["key"] in configmaps[ref["name"]], ref
    assert {"configMapRef": {"name": "tmaguard-toggles"}} in container["envFrom"]

    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            assert volume["configMap"]["name"] in configmaps
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts[configmaps["tmaguard-toggles"]["TMAGUARD_RECORD_DIR"]]]
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert volumes[mounts["/etc/tmaguard"]]["configMap"]["name"] == "tmaguard-preflight"

    service = find(objects, "Service", "vllm-api")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert _http_port(container, service["spec"]["ports"][0]["targetPort"]) == 8000


def _gpus(limits: dict) -> int:
    if "tencent.com/vcuda-core" in limits:
        return math.ceil(int(limits["tencent.com/vcuda-core"]) / 100)
    return int(limits["nvidia.com/gpu"])


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_gpu_requests_match_tensor_parallelism_and_the_layer(rendered, name) -> None:
    objects = rendered[name]
    container = vllm_container(objects)
    limits = container["resources"]["limits"]
    tp = int(find(objects, "ConfigMap", "vllm-server")["data"]["TENSOR_PARALLEL_SIZE"])
    assert _gpus(limits) == tp
    assert all(str(v).isdigit() for k, v in limits.items() if "/" in k), limits  # extended: whole numbers
    env = {e["name"]: e.get("value") for e in container["env"]}
    if "nvidia.com/gpumem" in limits and tp > 1:  # HAMi with tensor parallelism
        assert "--disable-custom-all-reduce" in container["args"]
        assert env["NCCL_CUMEM_HOST_ENABLE"] == "0"
    if "tencent.com/vcuda-core" in limits:
        # Share mode (< 100 cores) is when gpu-manager mounts the vCUDA layer; and then the env recipe.
        assert int(limits["tencent.com/vcuda-core"]) < 100 and "nvidia.com/gpu" not in limits
        overlay_dir = env["PREFLIGHT_OVERLAY_DIR"]
        assert env["LD_LIBRARY_PATH"].split(":")[0] == overlay_dir
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == overlay_dir)
        pod = find(objects, "Deployment", "vllm")["spec"]["template"]["spec"]
        assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == mount["name"])
    expected = {
        "base": "nvidia.com/gpu",
        "overlays/hami": "nvidia.com/gpumem",
        "overlays/vcuda": "tencent.com/vcuda-core",
    }
    assert expected[name] in limits


# --- toggles ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_toggles_configmap_holds_known_toggles_with_allowed_values(rendered, name) -> None:
    data = find(rendered[name], "ConfigMap", "tmaguard-toggles")["data"]
    specs = {spec.name: spec for spec in TOGGLES}
    assert data and all(key in specs for key in data), set(data) - set(specs)
    for key, value in data.items():
        assert not specs[key].allowed or value in specs[key].allowed, (key, value)
    parsed = parse_toggles(data)  # raises ToggleError on a bad value, as the guard would refuse it
    assert (parsed.mode, parsed.strict, parsed.record_dir) == ("auto", False, data["TMAGUARD_RECORD_DIR"])
    with pytest.raises(ToggleError, match="TMAGUARD_GEMM"):
        parse_toggles({**data, "TMAGUARD_GEMM": "fast"})
    # Only the toggles ConfigMap and the manifests' own variables: no stray TMAGUARD_* names elsewhere.
    container = vllm_container(rendered[name])
    assert not [e["name"] for e in container["env"] if e["name"].startswith("TMAGUARD_")]


def _doc_table() -> str:
    text = OPERATOR_DOC.read_text()
    begin, end = text.index(render.TOGGLES_BEGIN), text.index(render.TOGGLES_END)
    return text[begin + len(render.TOGGLES_BEGIN) : end].strip()


def test_the_operator_docs_toggles_table_is_the_one_the_code_generates() -> None:
    assert _doc_table() == render.toggles_table(), (
        "docs/operator.md's toggles table differs from vllm_tmaguard.toggles.TOGGLES; regenerate it with "
        "`python deploy/render.py toggles-table`"
    )
    # Independently of the generator: every row says what the spec says, in the spec's order.
    rows = [line.split(" | ") for line in _doc_table().splitlines()[2:]]
    assert [row[0].strip("| `") for row in rows] == [spec.name for spec in TOGGLES]
    for row, spec in zip(rows, TOGGLES, strict=True):
        values = [v.strip("`") for v in row[1].split(", ")] if spec.allowed else [row[1]]
        assert values == (list(spec.allowed) or [spec.kind]), spec.name
        assert row[2] == f"`{spec.default}`" and row[3].rstrip(" |").replace("\\|", "|") == spec.effect


def test_the_operator_docs_cover_the_error_strings_users_paste() -> None:
    text = OPERATOR_DOC.read_text()
    for error in (
        "undefined symbol: cuTensorMapEncodeTiled",
        "undefined symbol: cuGetProcAddress_v2",
        "CUBLAS_STATUS_NOT_INITIALIZED",
        "Segmentation fault",
        "an illegal instruction was encountered",
        "Failed to retrieve cuTensorMapEncodeTiled from libcuda.so.1",
        "Illegal device id",
        "--disable-custom-all-reduce",
        "appears to be a URI",
        "kubectl debug",
        "kubectl apply -k deploy/k8s/overlays/vcuda",
    ):
        assert error in text, error


# --- the preflight script --------------------------------------------------------------------------------


def _write_executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _write_preflight(rendered, tmp_path: Path) -> Path:
    """The vcuda overlay's preflight.sh, as the rendered ConfigMap carries it, written to a file."""
    script = tmp_path / "preflight.sh"
    script.write_text(
        find(rendered["overlays/vcuda"], "ConfigMap", "tmaguard-preflight")["data"]["preflight.sh"]
    )
    return script


@pytest.fixture
def preflight(rendered, tmp_path):
    """Runs the vcuda overlay's preflight.sh with stand-in `tmaguard` and `vllm` commands."""
    script = _write_preflight(rendered, tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _write_executable(
        bin_dir / "tmaguard",
        "#!/bin/sh\n"
        'if [ "$1" = env ]; then\n'
        '  echo "# vcuda: lacks cuTensorMapEncodeTiled"; [ "$FAKE_ENV_EXIT" = 0 ] || exit "$FAKE_ENV_EXIT"\n'
        '  mkdir -p "$3" && : > "$3/libcuda.so.1"; exit 0\n'
        "fi\n"
        'cat "$FAKE_DOCTOR_JSON"; [ -z "${FAKE_DOCTOR_STDERR:-}" ] || echo "$FAKE_DOCTOR_STDERR" >&2\n'
        'exit "$FAKE_DOCTOR_EXIT"\n',
    )
    _write_executable(
        bin_dir / "vllm", '#!/bin/sh\nprintf "%s\\n" "$LD_LIBRARY_PATH" "$@" > "$FAKE_VLLM_OUT"\n'
    )
    report = {
        "status": "problems",
        "findings": [
            {"severity": "info", "title": "GPU-sharing layer: vcuda", "fix": None},
            {
                "severity": "error",
                "title": "cuTensorMapEncodeTiled: the guard is off",
                "fix": {"text": "Set TMAGUARD_MODE=auto."},
            },
        ],
    }
    (tmp_path / "doctor.json").write_text(json.dumps(report))

    def run(*, doctor_exit=0, env_exit=0, strict="0", overlay=True, stderr="", **extra):
        env = {
            "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "TMAGUARD_STRICT": strict,
            "TMAGUARD_RECORD_DIR": str(tmp_path / "records"),
            "PREFLIGHT_TERMINATION_LOG": str(tmp_path / "termination-log"),
            "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64",
            "FAKE_ENV_EXIT": str(env_exit),
            "FAKE_DOCTOR_EXIT": str(doctor_exit),
            "FAKE_DOCTOR_JSON": str(tmp_path / "doctor.json"),
            "FAKE_DOCTOR_STDERR": stderr,
            "FAKE_VLLM_OUT": str(tmp_path / "vllm.out"),
            **({"PREFLIGHT_OVERLAY_DIR": str(tmp_path / "overlay")} if overlay else {}),
            **extra,
        }
        for stale in ("vllm.out", "termination-log"):
            (tmp_path / stale).unlink(missing_ok=True)
        done = subprocess.run(
            ["/bin/sh", str(script), "Qwen/x", "--port=8000"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        vllm = (tmp_path / "vllm.out").read_text().splitlines() if (tmp_path / "vllm.out").exists() else None
        termination = (
            (tmp_path / "termination-log").read_text() if (tmp_path / "termination-log").exists() else None
        )
        return done, vllm, termination

    return run


def test_preflight_installs_the_overlay_runs_the_doctor_and_execs_vllm(preflight, tmp_path) -> None:
    for volume in ("records", "overlay"):  # as kubelet creates emptyDir volumes
        (tmp_path / volume).mkdir()
        (tmp_path / volume).chmod(0o777)
    done, vllm, termination = preflight()
    assert done.returncode == 0 and termination is None, done.stderr
    assert stat.S_IMODE((tmp_path / "records").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "overlay").stat().st_mode) == 0o755
    assert vllm == [f"{tmp_path}/overlay:/usr/local/nvidia/lib64", "serve", "Qwen/x", "--port=8000"]
    assert (tmp_path / "overlay/libcuda.so.1").exists()
    assert json.loads((tmp_path / "records/doctor.json").read_text())["status"] == "problems"
    assert "tmaguard env: # vcuda: lacks cuTensorMapEncodeTiled" in done.stderr
    assert "doctor: healthy" in done.stderr
    # Already first on the path (the manifest's LD_LIBRARY_PATH): not added twice.
    done, vllm, _ = preflight(LD_LIBRARY_PATH=f"{tmp_path}/overlay:/usr/local/nvidia/lib64")
    assert vllm[0] == f"{tmp_path}/overlay:/usr/local/nvidia/lib64"
    # Without the overlay variable (base, hami): the library path is left alone.
    done, vllm, _ = preflight(overlay=False)
    assert vllm[0] == "/usr/local/nvidia/lib64"


def test_preflight_problems_are_logged_and_vllm_starts_unless_strict(preflight) -> None:
    done, vllm, termination = preflight(doctor_exit=1)
    assert done.returncode == 0 and vllm and termination is None
    assert (
        "doctor: error: cuTensorMapEncodeTiled: the guard is off. Fix: Set TMAGUARD_MODE=auto." in done.stderr
    )

    done, vllm, termination = preflight(doctor_exit=1, strict="1")
    assert done.returncode == 1 and vllm is None
    assert termination.startswith("tmaguard preflight (TMAGUARD_STRICT=1) stopped start-up: doctor: error: ")
    assert "Fix: Set TMAGUARD_MODE=auto." in termination

    message = "error: TMAGUARD_GEMM='fast' is not valid; allowed: auto | hopper | portable | latency"
    done, vllm, termination = preflight(doctor_exit=2, strict="1", stderr=message)
    assert done.returncode == 1 and vllm is None and message in termination and message in done.stderr

    done, vllm, termination = preflight(env_exit=1, strict="1")
    assert done.returncode == 1 and vllm is None and "could not install the overlay" in termination
    done, vllm, termination = preflight(env_exit=1)
    assert done.returncode == 0 and vllm and termination is None


def test_preflight_without_tmaguard_in_the_image(preflight, tmp_path) -> None:
    (tmp_path / "bin/tmaguard").unlink()
    done, vllm, termination = preflight(PATH=f"{tmp_path}/bin:/usr/bin:/bin")
    assert done.returncode == 0 and vllm and "no tmaguard command" in done.stderr
    done, vllm, termination = preflight(strict="1", PATH=f"{tmp_path}/bin:/usr/bin:/bin")
    assert done.returncode == 1 and vllm is None and "deploy/Dockerfile" in termination


def test_preflight_with_the_real_tmaguard_on_an_emulated_vcuda_pod(rendered, pods, tmp_path) -> None:
    """The vcuda overlay's recipe end to end: the real `tmaguard env` installs the overlay, and a process
    that loads libcuda.so.1 itself (no guard, as torch imported first would) gets the overlay in front of
    the layer, with what the layer lacks on libcuda.so.1's own handle."""
    tmaguard = Path(sys.executable).parent / "tmaguard"
    assert tmaguard.exists(), "the package's console script is missing: run scripts/setup_env.sh"
    pod = pods("vcuda")
    script = _write_preflight(rendered, tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _write_executable(
        bin_dir / "vllm",
        f"#!{sys.executable}\n"
        "import ctypes, json, os, sys\n"
        "handle = ctypes.CDLL('libcuda.so.1')\n"
        "names = ('cuTensorMapEncodeTiled', 'cuGetProcAddress_v2', 'cuLaunchKernelEx')\n"
        "maps = {line.split()[-1] for line in open('/proc/self/maps') if 'libcuda' in line}\n"
        "print('RESULT ' + json.dumps({'args': sys.argv[1:], 'maps': sorted(maps),\n"
        "    'handle': {n: hasattr(handle, n) for n in names}}))\n",
    )
    overlay_dir = tmp_path / "opt-tmaguard"
    env = {
        **{k: v for k, v in pod.environ().items() if not k.startswith(("TMAGUARD_", "PREFLIGHT_"))},
        **pod.env,
        "PATH": f"{bin_dir}:{tmaguard.parent}:/usr/bin:/bin",
        "PREFLIGHT_OVERLAY_DIR": str(overlay_dir),
        "LD_LIBRARY_PATH": f"{overlay_dir}:{pod.lib_dir}",  # what overlay-env.yaml sets, with the pod's paths
        "TMAGUARD_RECORD_DIR": str(tmp_path / "records"),
        "TMAGUARD_MODE": "off",  # no guard in this process: the installed overlay alone must do it
        "PREFLIGHT_TERMINATION_LOG": str(tmp_path / "termination-log"),
    }
    done = subprocess.run(
        ["/bin/sh", str(script), "m", "--port=8000"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["args"] == ["serve", "m", "--port=8000"]
    assert (
        str(overlay_dir / "libcuda.so.1") in result["maps"]
        and str(pod.lib_dir / "libcuda.so.1") in result["maps"]
    )
    assert all(result["handle"].values()), result["handle"]
    assert f"installed {overlay_dir}/libcuda.so.1" in done.stderr
    assert json.loads((tmp_path / "records/doctor.json").read_text())["schema"] == "tmaguard.doctor/1"

    # A restart of the container: the overlay is already first on the path; nothing to add, still works.
    again = subprocess.run(
        ["/bin/sh", str(script), "m"], env=env, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0 and "is already the tmaguard overlay" in again.stderr, again.stderr


# --- the image -------------------------------------------------------------------------------------------


def test_dockerfile_is_the_vllm_image_plus_the_wheel(release) -> None:
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(fileobj=io.BytesIO((DEPLOY / "Dockerfile").read_bytes()))
    instructions = [(s["instruction"], s["value"]) for s in parser.structure if s["instruction"] != "COMMENT"]
    names = [name for name, _ in instructions]
    assert names == ["ARG", "FROM", "RUN"], instructions  # one stage: no compiler, no build in the image
    tag = instructions[0][1].split("=", 1)
    assert tag[0] == "VLLM_IMAGE_TAG" and re.fullmatch(r"v\d+\.\d+\.\d+", tag[1]), tag
    assert instructions[1][1] == "vllm/vllm-openai:${VLLM_IMAGE_TAG}"
    assert parser.parent_images == [f"vllm/vllm-openai:{tag[1]}"]
    run = instructions[2][1]
    assert run.startswith("--mount=type=bind,source=dist,target=/dist") and "pip install" in run
    wheel = re.search(r"/dist/(vllm_tmaguard-.*?\.whl)", run).group(1)
    for arch, built in release.wheels.items():
        assert fnmatch.fnmatchcase(built.name, wheel.replace("$(uname -m)", arch)), (wheel, built.name)


def _dockerignore_context(root: Path, patterns_file: Path) -> list[str]:
    """The files `docker build` sends from `root` under a .dockerignore (moby's rules: the last matching
    pattern wins, a pattern that matches a parent directory matches what is below it, `!` re-includes)."""
    rules = []
    for line in patterns_file.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = "".join(
            ".*" if part == "**" else "[^/]*" if part == "*" else "[^/]" if part == "?" else re.escape(part)
            for part in re.split(r"(\*\*|\*|\?)", pattern)
        )
        rules.append((negate, re.compile(regex.replace(".*/", "(.*/)?") + "$")))
    sent = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        parts = relative.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        excluded = False
        for negate, regex in rules:
            if any(regex.match(prefix) for prefix in prefixes):
                excluded = not negate
        if not excluded:
            sent.append(relative)
    return sent


def test_the_build_context_is_the_manylinux_wheels_only(release, tmp_path) -> None:
    """A work tree after scripts/build_wheels.sh and a local `pip wheel .`: only the manylinux wheels go."""
    root = tmp_path / "repo"
    for relative in ("setup.py", "README.md", ".venv/bin/python", "tests/conftest.py", "build/lib/x.so"):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text("")
    (root / "dist").mkdir()
    for built in (release.sdist, *release.wheels.values()):
        shutil.copy(built, root / "dist")
    (root / "dist" / "vllm_tmaguard-0.1.0-cp311-cp311-linux_x86_64.whl").write_text("")
    sent = _dockerignore_context(root, DEPLOY / "Dockerfile.dockerignore")
    assert sent == sorted(f"dist/{wheel.name}" for wheel in release.wheels.values())
