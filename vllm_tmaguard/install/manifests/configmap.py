"""The wheel's ConfigMap: each wheel under its file name in binaryData, named as kustomize's
configMapGenerator names what it generates (NAME-<hash of the content>), so that a new wheel is a new
ConfigMap and the pods that mount it roll. The hash is kustomize's (api/hasher: sha256 of the JSON of kind,
data and binaryData with the name left empty, as kustomize 5 computes it, binaryData as its generator
writes it: base64 in lines of 70), checked against `kubectl kustomize` in tests/deploy."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

CONFIGMAP_LIMIT = 1 << 20  # the API server's cap on a ConfigMap's data
_LINE = 70
_HASH_LETTERS = str.maketrans("013ae", "ghkmt")
_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def kustomize_base64(data: bytes) -> str:
    """Base64 as kustomize's generator writes binaryData: lines of 70 each ending in a newline, or one line
    without when it fits in one."""
    encoded = base64.b64encode(data).decode("ascii")
    if len(encoded) < _LINE:
        return encoded
    return "".join(encoded[i : i + _LINE] + "\n" for i in range(0, len(encoded), _LINE))


def kustomize_hash(data: Mapping[str, str], binary_data: Mapping[str, str]) -> str:
    """The suffix kustomize gives a generated ConfigMap with this content."""
    document: dict[str, Any] = {"kind": "ConfigMap", "name": "", "data": dict(data) if data else ""}
    if binary_data:
        document["binaryData"] = dict(binary_data)
    encoded = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in _GO_ESCAPES.items():  # Go's json.Marshal escapes these inside strings
        encoded = encoded.replace(char, escaped)
    return hashlib.sha256(encoded.encode()).hexdigest()[:10].translate(_HASH_LETTERS)


def wheel_configmap(
    name: str, wheels: Mapping[str, bytes], namespace: str | None = None, hashed: bool = True
) -> dict[str, Any]:
    """A ConfigMap holding `wheels` ({key: bytes}) in binaryData; its name suffixed with the content's hash
    unless `hashed` is false. Raises ValueError past the API server's size cap."""
    size = sum(len(data) for data in wheels.values())
    if size > CONFIGMAP_LIMIT:
        raise ValueError(f"the wheels take {size} bytes, more than a ConfigMap holds ({CONFIGMAP_LIMIT})")
    binary = {key: kustomize_base64(data) for key, data in sorted(wheels.items())}
    metadata: dict[str, Any] = {"name": f"{name}-{kustomize_hash({}, binary)}" if hashed else name}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = {"app.kubernetes.io/part-of": "vllm-tmaguard"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "binaryData": binary}
