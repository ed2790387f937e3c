"""Which containers of a pod spec run vLLM or host its Ray workers. A container runs vLLM when its command
runs it (`vllm serve`, `python -m vllm.entrypoints...`, also inside `sh -c` or after
`source VENV/bin/activate;`), or when its image is vLLM's (`*/vllm-openai*`, `*/vllm`, llm-d's
`llm-d`/`llm-d-cuda`...) and it keeps the image's entry point (no `command`), or when its command runs
the guard's preflight script from the `tmaguard-preflight` ConfigMap, mounted (deploy/k8s/base: the script
ends in `exec vllm serve "$@"`). Init containers are never vLLM servers.

A Ray node hosts vLLM's Ray workers (actors the raylet starts, which inherit the node's environment, not the
head's): KubeRay's Ray container (the first of each head and worker group, where KubeRay runs `ray start`) and
a container whose command runs `ray start` or vLLM's `multi-node-serving.sh leader|worker`. Such a node gets
the guard where its image is vLLM's or one that another pod of the same object runs vLLM in (the cluster it
joins); the init container runs in that image, which must have vLLM's Python (and typer).

What cannot be told is refused, never guessed: a vLLM image running another command (production-stack's
LMCache server runs in `lmcache/vllm-openai`), "vllm" in an image or command that does not plainly run it (a
router, a server that imports vLLM itself, KServe's Hugging Face server), a Ray node in another image of a
cluster that runs vLLM or whose jobs name it (Ray Serve LLM, vLLM installed at run time by a runtime env).
The operator then names the containers: the pod template's annotation `vllm-tmaguard/containers: "a,b"`
("" for none; an inline pod spec's are its object's), or `--container NAME` for every pod (only the
containers so named, anywhere)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

ANNOTATION = "vllm-tmaguard/containers"
PREFLIGHT_CONFIGMAP = "tmaguard-preflight"  # deploy/k8s/base/tmaguard-preflight.yaml
_IMAGE_NAMES = re.compile(r"^(vllm|vllm-openai.*|llm-d(-(cuda|rocm|xpu|cpu|hpu|gaudi|aws|gke|dev))?)$")
_RUNS = re.compile(r"(?:^|[\s/;&|(\"'])vllm\s+serve(?:\s|$)|(?:^|\s)-m\s+vllm\.entrypoints\.")
_RAY_NODE = re.compile(
    r"(?:^|[\s/;&|(\"'])ray\s+start(?:\s|$)|multi-node-serving\.sh\s+(?:leader|worker)(?:\s|$)"
)


class Containers(NamedTuple):
    """Which containers of a pod run vLLM (or host its Ray workers), which this module does not judge."""

    runs_vllm: list[str]  # container names
    unclear: list[str]  # "name: why" for each container this module will not guess about


class Group(NamedTuple):
    """What the object a pod belongs to says about the Ray cluster its Ray nodes form."""

    images: frozenset[str] = frozenset()  # the images the object's pods plainly run vLLM in
    names_vllm: str = ""  # where else the object names vLLM (a RayJob's entrypoint, a Serve config)


def image_name(image: str) -> str:
    """The last path component of an image reference, without tag or digest."""
    name = image.partition("@")[0].rsplit("/", 1)[-1]
    return name.partition(":")[0]


def _words(container: dict[str, Any]) -> list[str]:
    return [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]


def runs_vllm_command(container: dict[str, Any]) -> bool:
    words = _words(container)
    if any(w.startswith("vllm.entrypoints.") for w in words):
        return True
    for index, word in enumerate(words):
        if word.rsplit("/", 1)[-1] == "vllm" and words[index + 1 : index + 2] == ["serve"]:
            return True
    return any(_RUNS.search(w) for w in words)


def runs_preflight(container: dict[str, Any], pod_spec: dict[str, Any]) -> bool:
    """Whether the container's command runs a file of the tmaguard-preflight ConfigMap where it mounts it."""
    volumes = {
        v.get("name") for v in pod_spec.get("volumes") or [] if isinstance(v, dict)
        and isinstance(v.get("configMap"), dict) and v["configMap"].get("name") == PREFLIGHT_CONFIGMAP
    }  # fmt: skip
    mounts = [
        str(m.get("mountPath", "")).rstrip("/") + "/"
        for m in container.get("volumeMounts") or [] if isinstance(m, dict) and m.get("name") in volumes
    ]  # fmt: skip
    words = [str(w) for w in (container.get("command") or [])]
    return any(w.startswith(mount) for w in words for mount in mounts if mount != "/")


def starts_ray_node(container: dict[str, Any]) -> bool:
    """Its command starts a Ray node (`ray start`, vLLM's multi-node-serving.sh)."""
    words = _words(container)
    joined = " ".join(words)
    return bool(_RAY_NODE.search(joined)) or any(_RAY_NODE.search(w) for w in words)


def vllm_image(container: dict[str, Any]) -> bool:
    return bool(_IMAGE_NAMES.match(image_name(str(container.get("image", "")))))


def _why_unclear(container: dict[str, Any]) -> str | None:
    image = str(container.get("image", ""))
    if image_name(image) == "huggingfaceserver":
        return f"KServe's Hugging Face server {image!r}, which serves with vLLM where vLLM supports the model"
    if vllm_image(container):
        return f"vLLM's image {image!r} with another command {container.get('command')!r}"
    words = [image, *_words(container)]
    if any("vllm" in w.lower() for w in words):
        return f"'vllm' in its image or command ({image!r}, {container.get('command')!r}) but no `vllm serve`"
    return None


def _why_ray_node_unclear(container: dict[str, Any], group: Group) -> str | None:
    image = str(container.get("image", ""))
    if group.images or group.names_vllm:
        where = f"runs vLLM in {sorted(group.images)}" if group.images else f"names vLLM ({group.names_vllm})"
        return (
            f"a Ray node in {image!r}, not an image vLLM runs in here, of a cluster that {where}: its Ray "
            "workers may run vLLM, and the guard's init container needs vLLM's Python in this image"
        )
    return _why_unclear(container)


def plainly_runs_vllm(container: dict[str, Any]) -> bool:
    """Runs vLLM by its command, or by vLLM's image and that image's entry point."""
    return runs_vllm_command(container) or (vllm_image(container) and not container.get("command"))


def vllm_containers(
    pod_spec: dict[str, Any],
    annotations: dict[str, Any],
    named: Sequence[str],
    group: Group | None = None,
    ray_node: bool = False,
    siblings: Sequence[str] = (),
) -> Containers:
    """The containers of `pod_spec` that run vLLM or host its Ray workers, and those it cannot tell about.
    `ray_node`: the pod is a KubeRay node, whose first container runs `ray start`. `siblings`: the containers
    of the other pod specs the annotations also speak for (an object's own annotations, over its pod specs):
    a name found there is not missing."""
    containers = [c for c in pod_spec.get("containers") or [] if isinstance(c, dict)]
    names = [str(c.get("name", "")) for c in containers]
    if ANNOTATION in annotations:
        chosen = [n.strip() for n in str(annotations[ANNOTATION]).split(",") if n.strip()]
        missing = [n for n in chosen if n not in names and n not in siblings]
        return Containers(
            [n for n in names if n in chosen],
            [f"{n}: named by {ANNOTATION}, no such container (the pod has {names})" for n in missing],
        )
    if named:
        return Containers([n for n in names if n in named], [])
    group = group or Group()
    runs, unclear = [], []
    for index, (container, name) in enumerate(zip(containers, names, strict=True)):
        if plainly_runs_vllm(container) or runs_preflight(container, pod_spec):
            runs.append(name)
        elif (ray_node and index == 0) or starts_ray_node(container):
            if vllm_image(container) or str(container.get("image", "")) in group.images:
                runs.append(name)  # hosts vLLM's Ray workers
            elif (why := _why_ray_node_unclear(container, group)) is not None:
                unclear.append(f"{name}: {why}")
        elif (why := _why_unclear(container)) is not None:
            unclear.append(f"{name}: {why}")
    return Containers(runs, unclear)
