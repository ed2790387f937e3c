"""The guard's decision as a Prometheus info metric on vLLM's own /metrics (docs/operator.md,
"Fleet visibility"; alert rules in deploy/monitoring). `info_labels` is a pure function of the record;
`export` registers the gauge where vLLM's API server serves its registry. Never imports prometheus_client
itself (70 ms cold, in every process): `vllm serve` has imported it by the time the general plugin runs in
the API server."""

import sys
from collections.abc import Mapping
from typing import Any

from .codes import LAYER_BYPASSED, LAYER_NOT_IN_FORCE

METRIC = "tmaguard_info"
LABELS = (
    "outcome", "layer", "tma_usable", "routing", "problems", "mode", "tmaguard_version", "vllm_version",
    "layer_in_force", "layer_sha256",
)  # fmt: skip


def info_labels(record: Mapping[str, Any]) -> dict[str, str]:
    """The labels of one process's record: values an alert can match, never a path or an environment
    value (those stay in the record file)."""
    layers = record.get("layers") or []
    tma = record.get("tma")
    routing = record.get("routing") or {}
    routed_away = routing.get("disabled_kernels") or routing.get("blocked_imports") or routing.get("env")
    problems = record.get("problems") or []
    off = any(p.get("code") in (LAYER_NOT_IN_FORCE, LAYER_BYPASSED) for p in problems)
    first = layers[0]["name"] if layers else None
    library = next((f for f in record.get("layer_files") or [] if f.get("layer") == first), None)
    return {
        "outcome": str(record.get("outcome")),
        "layer": layers[0]["name"] if layers else "none",
        "tma_usable": "unknown" if tma is None else str(bool(tma.get("usable"))).lower(),
        "routing": "tma-avoided" if routed_away else "vllm-default",
        "problems": str(len(record.get("problems") or [])),
        "mode": str(record.get("mode")),
        "tmaguard_version": str(record.get("tmaguard")),
        "vllm_version": str((record.get("vllm") or {}).get("version") or "none"),
        # "false": a layer is configured but not loaded, so its quota is not in force
        "layer_in_force": "none" if not layers else "false" if off else "true",
        "layer_sha256": str((library or {}).get("sha256") or "none"),  # which build of the layer
    }


def export(record: Mapping[str, Any] | None) -> bool:
    """Sets tmaguard_info{...} = 1 in prometheus_client's default registry, which vLLM serves (or in the
    multiprocess directory when vLLM runs several API servers). Returns whether it did: False where
    prometheus_client is not loaded (not an API server) or the gauge exists already."""
    client = sys.modules.get("prometheus_client")
    if record is None or client is None:
        return False
    try:
        gauge = client.Gauge(
            METRIC,
            "What vllm-tmaguard found and decided in this vLLM process (1 per label set).",
            labelnames=LABELS,
            multiprocess_mode="mostrecent",  # as vLLM's own *_info gauges
        )
    except ValueError:  # registered already (a second plugin call in the same process)
        return False
    gauge.labels(**info_labels(record)).set(1)
    return True
