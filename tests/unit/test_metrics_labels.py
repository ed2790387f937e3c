"""metrics.info_labels: the record's values an alert can match, nothing that could carry a path or a
secret."""

from __future__ import annotations

import pytest

from vllm_tmaguard.metrics import LABELS, info_labels

VCUDA_H100 = {
    "tmaguard": "0.1.0",
    "mode": "auto",
    "outcome": "supplied",
    "layers": [
        {"name": "vcuda", "label": "tkestack vCUDA", "evidence": ["/etc/vcuda exists"], "remote": False}
    ],
    "tma": {"usable": True, "reason": "cuTensorMapEncodeTiled from /usr/local/nvidia/lib64/libcuda.so.580"},
    "routing": {"env": {}, "disabled_kernels": [], "blocked_imports": [], "families": []},
    "problems": [],
    "vllm": {"version": "0.25.1", "found": True},
    "libcuda": {"path": "/usr/local/nvidia/lib64/libcuda.so.1"},
}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({}, {"outcome": "supplied", "layer": "vcuda", "tma_usable": "true", "routing": "vllm-default"}),
        ({"layers": [], "outcome": "nothing-missing"}, {"layer": "none", "outcome": "nothing-missing"}),
        ({"tma": None}, {"tma_usable": "unknown"}),
        (
            {
                "tma": {"usable": False, "reason": "lupine: no local driver"},
                "routing": {
                    "env": {"VLLM_DISABLED_KERNELS": "MacheteLinearKernel"},
                    "disabled_kernels": ["Machete"],
                },
            },
            {"tma_usable": "false", "routing": "tma-avoided"},
        ),
        ({"problems": [{"code": "handle-scoped-gap"}] * 2}, {"problems": "2"}),
        ({"vllm": {"found": False}}, {"vllm_version": "none"}),
    ],
)
def test_labels(change: dict, expected: dict) -> None:
    labels = info_labels({**VCUDA_H100, **change})
    assert tuple(labels) == LABELS
    assert {k: labels[k] for k in expected} == expected


def test_no_path_reaches_a_label() -> None:
    assert not any("/" in value for value in info_labels(VCUDA_H100).values())
