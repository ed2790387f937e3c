"""A vLLM run eager under a layer with no local driver (lupine's client): each kernel launch is a round trip
to the GPU's server, so `auto` routes W4A16 to Marlin (2 round trips a GEMM against Machete's 6-7); with CUDA
graphs, or with a local driver, vLLM keeps its Machete (docs/design.md §3.3). The eager flags are read as
vLLM's own argument parser reads them: checked against that parser."""

from __future__ import annotations

import json

from test_routing import GUARD_ONLY, H100, selectors  # vLLM's real selectors in a fresh process

from vllm_tmaguard.launch import eager_flag

ROUND_TRIPS = "sends every driver call to its server and vLLM runs eager"

# The command lines (after `vllm serve MODEL`), each spelling vLLM's parser takes.
COMMAND_LINES = [
    [],
    ["--enforce-eager"],
    ["--enforce_eager"],
    ["--enforce-eager", "--no-enforce-eager"],
    ["--no-enforce-eager", "--enforce-eager"],
    ["-O0"],
    ["-O", "0"],
    ["-O=0"],
    ["--optimization-level", "0"],
    ["--optimization-level=0"],
    ["--optimization_level=0"],
    ["-O3"],
    ["-O0", "-O2"],
    ["-cc", '{"cudagraph_mode": "NONE"}'],
    ["--compilation-config", '{"cudagraph_mode": "NONE"}'],
    ['--compilation-config={"cudagraph_mode": "NONE"}'],
    ["-cc.cudagraph_mode=NONE"],
    ["--compilation-config.cudagraph_mode", "NONE"],
    ["-cc", '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'],
    ["-O0", "-cc", '{"cudagraph_mode": "PIECEWISE"}'],
    ["--enforce-eager", "-O3"],
    ["--enforce-eager", "-cc", '{"cudagraph_mode": "PIECEWISE"}'],
    ["-cc", '{"mode": 0}'],
    ["--seed", "0", "--max-model-len", "0"],
]

# vLLM's parser (FlexibleArgumentParser with EngineArgs' arguments), and what its config does with the three
# settings (config/vllm.py: enforce_eager sets cudagraph_mode NONE; -O0's defaults leave NONE unless the
# compilation config names a mode).
VLLM_PARSE = """
import json, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
answers = []
for line in json.loads(sys.argv[1]):
    args = parser.parse_args(["--model", "m", *line])
    mode = args.compilation_config.cudagraph_mode
    level = args.optimization_level
    answers.append({
        "enforce_eager": bool(args.enforce_eager),
        "level": None if level is None else int(level),
        "mode": None if mode is None else str(getattr(mode, "name", mode)).upper(),
    })
print("RESULT " + json.dumps(answers))
"""


def test_eager_flags_agree_with_vllms_own_parser(pods, run_python) -> None:
    lines = [json.dumps(COMMAND_LINES)]
    run = run_python(pods("bare", **H100), VLLM_PARSE, {"TMAGUARD_MODE": "off"}, args=lines)
    assert run.returncode == 0, run.stderr[-3000:]
    (result,) = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    parsed = json.loads(result.removeprefix("RESULT "))
    for line, vllm in zip(COMMAND_LINES, parsed, strict=True):
        runs_eager = vllm["enforce_eager"] or (
            vllm["mode"] == "NONE" if vllm["mode"] is not None else vllm["level"] == 0
        )
        flag = eager_flag(["vllm", "serve", "MODEL", *line])
        assert (flag is not None) == runs_eager, (line, vllm, flag)
        assert flag is None or flag.replace("'", "") in " ".join(line), (line, flag)  # as written


def _w4a16(run_python, pod, args: list[str]) -> tuple[str, dict]:
    result, record = selectors(run_python, pod, tuple(args))
    return result["w4a16"], record


def test_eager_under_a_network_layer_routes_w4a16_to_marlin(pods, run_python) -> None:
    chosen, record = _w4a16(run_python, pods("lupine-client", **H100), ["--enforce-eager"])
    assert chosen == "MarlinLinearKernel"
    mixed = next(f for f in record["routing"]["families"] if f["family"] == "mixed-precision linear")
    assert mixed["path"] == "Marlin (cp.async)"
    assert f"lupine (GPU over the network) {ROUND_TRIPS} (--enforce-eager)" in mixed["why"]
    assert record["tma"]["usable"] is True  # the encoder is reached: only the round trips decide


def test_graphs_under_a_network_layer_keep_machete(pods, run_python) -> None:
    chosen, record = _w4a16(run_python, pods("lupine-client", **H100), ["-O3"])
    assert chosen == "MacheteLinearKernel"
    assert "VLLM_DISABLED_KERNELS" not in record["routing"]["env"]


def test_eager_with_a_local_driver_keeps_machete(pods, run_python) -> None:
    chosen, record = _w4a16(run_python, pods("bare", **H100), ["-cc", '{"cudagraph_mode": "NONE"}'])
    assert chosen == "MacheteLinearKernel"
    assert all(ROUND_TRIPS not in f["why"] for f in record["routing"]["families"])


def test_a_verdict_is_replayed_only_for_the_same_eager_flag(pods, run_python) -> None:
    """The flag is an input of the verdict cache (verdict.observe_process): a process started without it does
    not replay the eager process's routing, and one started with it does."""
    pod = pods("lupine-client", **H100)
    code = GUARD_ONLY + "import os, json\nprint('RESULT ' + json.dumps({'pid': os.getpid()}))\n"
    first = run_python(pod, code, args=["--enforce-eager"])
    stored = first.record_of(first.result["pid"])
    assert stored["replayed_from"] is None and "MacheteLinearKernel" in stored["routing"]["env"].get(
        "VLLM_DISABLED_KERNELS", ""
    )
    graphs = run_python(pod, code)
    with_graphs = graphs.record_of(graphs.result["pid"])
    assert with_graphs["replayed_from"] is None
    assert "MacheteLinearKernel" not in with_graphs["routing"]["env"].get("VLLM_DISABLED_KERNELS", "")
    again = run_python(pod, code, args=["--enforce-eager"])
    assert again.record_of(again.result["pid"])["replayed_from"] == first.result["pid"]
