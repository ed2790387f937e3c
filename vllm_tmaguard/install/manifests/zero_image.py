"""The zero-image install added to a pod spec: an init container that runs in the vLLM container's own image
and places the package from the wheel ConfigMap (`tmaguard inject --wheel`, with the package imported from
the wheel itself), the two volumes, and in each vLLM container PYTHONPATH, the package's mount and the
toggles ConfigMap (optional: the defaults hold without it). deploy/k8s/overlays/vcuda-stock-image writes the
same pieces by hand (tests/deploy/test_deploy_zero_image.py holds the two equal).

Each `ensure_*` adds only what is missing and says whether it changed anything: a second run changes
nothing."""

from __future__ import annotations

import copy
import re
from typing import Any

from ..wheel import PIN_VARIABLE

INIT_CONTAINER = "tmaguard-inject"
PACKAGE_VOLUME = "tmaguard-package"
PACKAGE_DIR = "/opt/vllm-tmaguard"
WHEEL_VOLUME = "tmaguard-wheel"
WHEEL_DIR = "/opt/tmaguard-wheel"
WHEEL_CONFIGMAP = "tmaguard-wheel"
# The file the kustomize overlay's configMapGenerator reads (`tmaguard wheel-configmap WHEEL --into DIR`).
OVERLAY_WHEEL = "vllm-tmaguard.whl"
TOGGLES_CONFIGMAP = "tmaguard-toggles"
# Runs in the image's own Python (-I: no PYTHONPATH or user site of the image's), standard library only: the
# package imported from the first wheel in the ConfigMap volume (its Python is the same for every machine),
# from the very bytes checked against the pin where one is set (a copy in memory: a ConfigMap edited between
# the check and the import changes nothing), then `tmaguard inject --wheel DIR TARGET`, which picks the wheel
# for this machine, checks it against its RECORD and the pin, and places it from the bytes it checked.
BOOTSTRAP = f"""\
import glob, hashlib, os, sys
wheels = sorted(glob.glob(sys.argv[3] + '/*.whl'))
if not wheels:
    sys.exit(f'tmaguard inject: {{sys.argv[3]}}: refused: no wheel in the wheel ConfigMap')
with open(wheels[0], 'rb') as file:
    data = file.read()
pins = os.environ.get('{PIN_VARIABLE}', '').replace(',', ' ').lower().split()
digest = hashlib.sha256(data).hexdigest()
if pins and digest not in pins:
    sys.exit(f'tmaguard inject: {{wheels[0]}}: refused: its sha256 {{digest}} '
             'is not one that {PIN_VARIABLE} pins')
memory = os.memfd_create('vllm-tmaguard.whl')
with open(memory, 'wb', closefd=False) as copy:
    copy.write(data)
sys.path[:0] = [f'/proc/self/fd/{{memory}}']
from vllm_tmaguard.__main__ import main
main()
"""
PYTHON = "python3"  # the image's, from its PATH, where the vLLM container's command names no other
COMMAND = [PYTHON, "-I", "-c", BOOTSTRAP]
ARGS = ["inject", "--wheel", WHEEL_DIR, PACKAGE_DIR]
RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}


_ACTIVATES = re.compile(r"(?:^|[\s;&|(])(?:source|\.)\s+(/[^\s;&|()'\"]+)/bin/activate(?=$|[\s;&|)'\"])")
_VENV_PROGRAM = re.compile(r"^(/[^\s;&|()'\"]+)/bin/(vllm|python3?(\.\d+)?)$")
_TOKENS = re.compile(r"[\s;&|()'\"]+")


def interpreter_found(vllm: dict[str, Any]) -> tuple[str, str]:
    """The Python that runs vLLM in the container `vllm`, as its command names it, and how it was told:
    VENV/bin/python3 where the command activates a virtual environment (llm-d: `source /opt/vllm/bin/activate;
    exec vllm serve ...`) or runs `VENV/bin/vllm`; an absolute python it runs; else the image's `python3`.
    The package placed on PYTHONPATH serves any Python 3 (a venv's python reads sitecustomize.py from
    PYTHONPATH too); the init container needs one that runs the bootstrap and has typer."""
    words = [str(w) for w in (vllm.get("command") or []) + (vllm.get("args") or [])]
    for word in words:
        if found := _ACTIVATES.search(word):
            return f"{found.group(1)}/bin/python3", f"the venv {found.group(1)} its command activates"
    for token in (t for word in words for t in _TOKENS.split(word)):
        if found := _VENV_PROGRAM.match(token):
            if found.group(2) != "vllm":
                return token, "the python its command runs"
            return f"{found.group(1)}/bin/python3", f"the venv {found.group(1)} whose vllm its command runs"
    return PYTHON, "the image's, on its PATH"


def interpreter(vllm: dict[str, Any]) -> str:
    """The Python that runs vLLM in the container `vllm` (interpreter_found)."""
    return interpreter_found(vllm)[0]


def init_python(pod_spec: dict[str, Any], vllm: dict[str, Any], python: str | None) -> str:
    """What the pod's init container runs, in words, for the guarded line: `python` named by --python, the
    one the vLLM container's command names, or the one an earlier run (or a hand) put there."""
    ours = next((c for c in pod_spec.get("initContainers") or [] if c.get("name") == INIT_CONTAINER), {})
    command = ours.get("command")
    running = str(command[0]) if isinstance(command, list) and command else python or interpreter(vllm)
    found, how = interpreter_found(vllm)
    why = how if running == found else "as its init container already had it"
    why = "named by --python" if python else why
    return f"tmaguard-inject runs `{running}`, {why}"


def init_container(
    vllm: dict[str, Any], pins: tuple[str, ...] = (), python: str | None = None
) -> dict[str, Any]:
    """The init container for a pod whose vLLM container is `vllm`: its image, pull policy and security
    context (so that the files are its user's), the Python that runs vLLM there (`python`, else the one its
    command names), no GPU; with `pins` (the wheels' sha256), the pin that makes it refuse any other wheel."""
    container: dict[str, Any] = {"name": INIT_CONTAINER, "image": vllm.get("image")}
    if "imagePullPolicy" in vllm:
        container["imagePullPolicy"] = vllm["imagePullPolicy"]
    command = [python or interpreter(vllm), *COMMAND[1:]]
    container |= {"command": command, "args": list(ARGS), "resources": copy.deepcopy(RESOURCES)}
    if pins:
        container["env"] = [pin_variable(pins)]
    if "securityContext" in vllm:
        container["securityContext"] = copy.deepcopy(vllm["securityContext"])
    container["volumeMounts"] = [
        {"name": WHEEL_VOLUME, "mountPath": WHEEL_DIR, "readOnly": True},
        {"name": PACKAGE_VOLUME, "mountPath": PACKAGE_DIR},
    ]
    return container


def pin_variable(pins: tuple[str, ...]) -> dict[str, str]:
    return {"name": PIN_VARIABLE, "value": ",".join(sorted(set(pins)))}


# The overlay's place for the pin (deploy/k8s/overlays/vcuda-stock-image, after zero-image.yaml): a JSON 6902
# patch of the init container's env, shipped empty (no pin), which `tmaguard wheel-configmap WHEEL --into
# DIR` writes with WHEEL's digest. It is in the pod spec, not in a ConfigMap: changing it takes the rights to
# change the Deployment.
OVERLAY_PIN = "wheel-pin.yaml"
_PIN_PATCH = """\
# The init container's wheel pin, {variable}: the sha256 of each wheel it may place (empty: any
# wheel its RECORD vouches for). `tmaguard wheel-configmap WHEEL --into DIR` writes this file with WHEEL's
# digest (docs/operator.md, zero image).
- op: add
  path: /spec/template/spec/initContainers/0/env
  value:
    - name: {variable}
      value: "{value}"
"""


def overlay_pin_patch(pins: tuple[str, ...]) -> str:
    """The overlay's wheel-pin.yaml for `pins` (none: the file as the repository ships it)."""
    return _PIN_PATCH.format(variable=PIN_VARIABLE, value=pin_variable(pins)["value"])


def volumes(wheel_configmap: str = WHEEL_CONFIGMAP) -> list[dict[str, Any]]:
    return [
        {"name": PACKAGE_VOLUME, "emptyDir": {}},
        {"name": WHEEL_VOLUME, "configMap": {"name": wheel_configmap}},
    ]


def ensure_pod(
    pod_spec: dict[str, Any],
    vllm: dict[str, Any],
    wheel_configmap: str,
    pins: tuple[str, ...] = (),
    python: str | None = None,
    init: bool = True,
) -> bool:
    """The init container (first, before any init container of the chart's that might start vLLM code, and
    before what an operator appends: KubeRay's wait-gcs-ready), pinned to `pins` where given (a pin of other
    wheels replaced), running `python` where given (another one replaced), and the volumes. `init` False: the
    volumes alone (a KServe ServingRuntime, whose pod spec has no init containers)."""
    changed = _ensure_init(pod_spec, vllm, pins, python) if init else False
    present = {v.get("name"): v for v in pod_spec.setdefault("volumes", [])}
    for volume in volumes(wheel_configmap):
        if volume["name"] not in present:
            pod_spec["volumes"].append(volume)
            changed = True
        elif volume["name"] == WHEEL_VOLUME and present[WHEEL_VOLUME].get("configMap") != volume["configMap"]:
            present[WHEEL_VOLUME]["configMap"] = volume["configMap"]  # another wheel given: its ConfigMap
            changed = True
    return changed


def _ensure_init(
    pod_spec: dict[str, Any], vllm: dict[str, Any], pins: tuple[str, ...], python: str | None
) -> bool:
    changed = False
    inits = pod_spec.setdefault("initContainers", [])
    ours = next((c for c in inits if c.get("name") == INIT_CONTAINER), None)
    if ours is None:
        inits.insert(0, init_container(vllm, pins, python))
        return True
    if pins:
        env = [e for e in ours.get("env") or [] if e.get("name") != PIN_VARIABLE]
        if [*env, pin_variable(pins)] != ours.get("env"):
            ours["env"] = [*env, pin_variable(pins)]
            changed = True
    command = ours.get("command")
    if python and isinstance(command, list) and command[:1] != [python]:
        ours["command"] = [python, *command[1:]]
        changed = True
    return changed


def ensure_container(container: dict[str, Any]) -> bool:
    """PYTHONPATH with the package first, its read-only mount, the toggles ConfigMap. Raises ValueError for a
    PYTHONPATH this cannot prepend to."""
    changed = False
    env = container.setdefault("env", [])
    found = next((e for e in env if e.get("name") == "PYTHONPATH"), None)
    if found is None:
        env.append({"name": "PYTHONPATH", "value": PACKAGE_DIR})
        changed = True
    elif "valueFrom" in found:
        raise ValueError("its PYTHONPATH comes from valueFrom: set it as a value, with the package first")
    elif str(found.get("value", "")).split(":")[0] != PACKAGE_DIR:
        found["value"] = f"{PACKAGE_DIR}:{found['value']}" if found.get("value") else PACKAGE_DIR
        changed = True
    mounts = container.setdefault("volumeMounts", [])
    if not any(m.get("name") == PACKAGE_VOLUME for m in mounts):
        mounts.append({"name": PACKAGE_VOLUME, "mountPath": PACKAGE_DIR, "readOnly": True})
        changed = True
    sources = container.setdefault("envFrom", [])
    if not any((s.get("configMapRef") or {}).get("name") == TOGGLES_CONFIGMAP for s in sources):
        sources.append({"configMapRef": {"name": TOGGLES_CONFIGMAP, "optional": True}})
        changed = True
    return changed
