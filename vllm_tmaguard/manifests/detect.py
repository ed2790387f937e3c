"""Which containers of a pod spec run vLLM. A container runs vLLM when its command runs it (`vllm serve`,
`python -m vllm.entrypoints...`, also inside `sh -c`), or when its image is vLLM's (`*/vllm-openai*`,
`*/vllm`) and it keeps the image's entry point (no `command`), or when its command runs the guard's
preflight script from the `tmaguard-preflight` ConfigMap, mounted (deploy/k8s/base: the script ends in
`exec vllm serve "$@"`). Init containers are never vLLM servers.

What cannot be told is refused, never guessed: a vLLM image running another command (production-stack's
LMCache server runs in `lmcache/vllm-openai`), or "vllm" in an image or command that does not plainly run
it (a router, a server that imports vLLM itself). The operator then names the containers: the pod
template's annotation `vllm-tmaguard/containers: "a,b"` ("" for none), or `--container NAME` for every pod
(only the containers so named, anywhere)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

ANNOTATION = "vllm-tmaguard/containers"
PREFLIGHT_CONFIGMAP = "tmaguard-preflight"  # deploy/k8s/base/tmaguard-preflight.yaml
_IMAGE_NAMES = re.compile(r"^(vllm|vllm-openai.*)$")
_RUNS = re.compile(r"(?:^|[\s/;&|(\"'])vllm\s+serve(?:\s|$)|(?:^|\s)-m\s+vllm\.entrypoints\.")


class Verdict(NamedTuple):
    runs_vllm: list[str]  # container names
    unclear: list[str]  # "name: why" for each container this module will not guess about


def image_name(image: str) -> str:
    """The last path component of an image reference, without tag or digest."""
    name = image.partition("@")[0].rsplit("/", 1)[-1]
    return name.partition(":")[0]


def runs_vllm_command(container: dict[str, Any]) -> bool:
    words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
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


def _why_unclear(container: dict[str, Any]) -> str | None:
    image = str(container.get("image", ""))
    if _IMAGE_NAMES.match(image_name(image)):
        return f"vLLM's image {image!r} with another command {container.get('command')!r}"
    words = [image, *map(str, (container.get("command") or []) + (container.get("args") or []))]
    if any("vllm" in w.lower() for w in words):
        return f"'vllm' in its image or command ({image!r}, {container.get('command')!r}) but no `vllm serve`"
    return None


def vllm_containers(pod_spec: dict[str, Any], annotations: dict[str, Any], named: Sequence[str]) -> Verdict:
    """The containers of `pod_spec` that run vLLM, and those it cannot tell about."""
    containers = [c for c in pod_spec.get("containers") or [] if isinstance(c, dict)]
    names = [str(c.get("name", "")) for c in containers]
    if ANNOTATION in annotations:
        chosen = [n.strip() for n in str(annotations[ANNOTATION]).split(",") if n.strip()]
        missing = [n for n in chosen if n not in names]
        return Verdict(
            [n for n in names if n in chosen],
            [f"{n}: named by {ANNOTATION}, no such container" for n in missing],
        )
    if named:
        return Verdict([n for n in names if n in named], [])
    runs, unclear = [], []
    for container, name in zip(containers, names, strict=True):
        image = str(container.get("image", ""))
        if (
            runs_vllm_command(container)
            or (_IMAGE_NAMES.match(image_name(image)) and not container.get("command"))
            or runs_preflight(container, pod_spec)
        ):
            runs.append(name)
        elif (why := _why_unclear(container)) is not None:
            unclear.append(f"{name}: {why}")
    return Verdict(runs, unclear)
