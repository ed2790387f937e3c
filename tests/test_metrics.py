"""The decision on vLLM's /metrics: the real plugin loader calls the guard's general plugin in a process
that has imported prometheus_client (as `vllm serve` has), and a scrape of the registry vLLM serves shows
tmaguard_info with the record's labels, in vLLM's one-API-server mode and its multiprocess mode."""

from __future__ import annotations

import hashlib

import pytest

SCRAPE = """
import json, os, sys
import prometheus_client  # `vllm serve` imports it (vllm/entrypoints/cli/serve.py) before the plugins run
out = {}
from vllm.platforms import current_platform
out["platform"] = type(current_platform).__name__
from vllm.plugins import load_general_plugins
load_general_plugins()
load_general_plugins()  # vLLM calls it from several places: one gauge, no error
from vllm.v1.metrics.prometheus import get_prometheus_registry
text = prometheus_client.generate_latest(get_prometheus_registry()).decode()
out["lines"] = [line for line in text.splitlines() if line.startswith("tmaguard_info")]
print("RESULT " + json.dumps(out))
"""

NO_CLIENT = """
import json, sys
from vllm.platforms import current_platform
from vllm.plugins import load_general_plugins
load_general_plugins()
print("RESULT " + json.dumps({"imported": "prometheus_client" in sys.modules}))
"""


def _labels(line: str) -> dict[str, str]:
    inside = line[line.index("{") + 1 : line.rindex("}")]
    return dict(part.split("=", 1) for part in inside.replace('"', "").split(","))


H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "cc": "9.0"}
CASES = {
    # An RTX 4090 under vCUDA: the overlay supplied what the layer lacks; no sm_90, vLLM's choices stand.
    "vcuda": (
        {},
        {"outcome": "supplied", "layer": "vcuda", "tma_usable": "false", "routing": "vllm-default"},
    ),
    # An H100 behind a network layer: no local encoder, so the TMA kernels are routed away.
    "lupine": (
        H100,
        {"outcome": "supplied", "layer": "lupine", "tma_usable": "false", "routing": "tma-avoided"},
    ),
}


@pytest.mark.parametrize("multiprocess", [False, True])
@pytest.mark.parametrize("kind", list(CASES))
def test_the_info_metric_in_a_scrape_of_vllms_registry(
    pods, run_python, tmp_path, multiprocess, kind
) -> None:
    env = {}
    if multiprocess:  # what vLLM sets with --api-server-count > 1 (vllm/v1/metrics/prometheus.py)
        (tmp_path / "prom").mkdir()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "prom")
    gpu, expected = CASES[kind]
    pod = pods(kind, **gpu)
    run = run_python(pod, SCRAPE, env)
    (line,) = run.result["lines"]
    assert line.endswith(" 1.0")
    assert _labels(line) == {
        **expected,
        "problems": str(len(run.last_record()["problems"])),
        "mode": "auto",
        "tmaguard_version": "0.1.0",
        "vllm_version": "0.32.0",
        "layer_in_force": "true",
        "layer_sha256": _sha256_12(pod.lib_dir / "libcuda.so.1"),  # the layer is libcuda.so.1 there
    }


def _sha256_12(path) -> str:  # type: ignore[no-untyped-def]
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def test_a_layer_not_in_force_in_the_metric(pods, run_python) -> None:
    """Issue 32 item 3: HAMi-core's limits set, its preload naming a directory where the library should be
    (what the loader skips: HAMi #777): the scrape says the layer is not in force, and no build of it."""
    pod = pods("hami", cc="9.0")
    library = pod.root / "usr/local/vgpu/libvgpu.so"
    library.unlink()
    library.mkdir()
    run = run_python(pod, SCRAPE)
    assert "cannot be preloaded (cannot read file data): ignored." in run.stderr  # the real loader's words
    (line,) = run.result["lines"]
    labels = _labels(line)
    assert (labels["layer"], labels["layer_in_force"], labels["layer_sha256"]) == ("hami", "false", "none")
    assert labels["outcome"] == "degraded" and labels["problems"] == "1"


def test_a_process_without_prometheus_client_does_not_import_it(pods, run_python) -> None:
    """EngineCore and workers: the 70 ms import is not the guard's to add."""
    assert run_python(pods("bare"), NO_CLIENT).result == {"imported": False}
