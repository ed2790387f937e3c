"""A vLLM run eager under a layer with no local driver (lupine's client): each kernel launch is a round trip
to the GPU's server, so `auto` routes W4A16 to Marlin (2 round trips a GEMM against Machete's 6-7); with CUDA
graphs, or with a local driver, vLLM keeps its Machete (docs/design.md §3.3). The eager flags are read as
vLLM's own argument parser reads them, a `--config` YAML file's too: checked against that parser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from test_routing import GUARD_ONLY, H100, selectors  # vLLM's real selectors in a fresh process

from vllm_tmaguard.launch_file import MAX_BYTES, process_eager_flag
from vllm_tmaguard.process import eager_flag
from vllm_tmaguard.stages import ray_env

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


# A `--config` file and the command line after it: vLLM puts the file's settings first (its parser's
# _pull_args_from_config), so the command line's win.
CONFIG_CASES = [
    ("enforce_eager: true\n", []),
    ("enforce-eager: true\n", ["--no-enforce-eager"]),
    ("enforce-eager: false\n", ["--enforce-eager"]),
    ("enforce-eager: false\n", []),
    ("enforce_eager: false\n", ["-O0"]),
    ("optimization-level: 0\n", []),
    ("optimization_level: 0\n", ["-O3"]),
    ("optimization-level: 3\n", ["-O0"]),
    ("compilation-config:\n  cudagraph_mode: NONE\n", []),
    ("compilation_config:\n  cudagraph_mode: PIECEWISE\n", ["-O0"]),
    ("compilation-config:\n  mode: 0\n", []),
    ("compilation-config.cudagraph_mode: NONE\n", []),
    ("seed: 1\nmax-model-len: 64\n", ["-O0"]),
    ("seed: 1\n", []),
]


def _runs_eager(vllm: dict) -> bool:
    return vllm["enforce_eager"] or (
        vllm["mode"] == "NONE" if vllm["mode"] is not None else vllm["level"] == 0
    )


def test_eager_flags_and_config_files_agree_with_vllms_own_parser(pods, run_python, tmp_path) -> None:
    """The command lines, then `--config` files with a command line after them, all parsed by vLLM's parser
    in one process (one vLLM import for both tables)."""
    configs, written = [], []
    for index, (text, cli) in enumerate(CONFIG_CASES):
        path = tmp_path / f"serve-{index}.yaml"
        path.write_text(text)
        configs.append(["--config", str(path), *cli])
        written.append(text)
    lines = [json.dumps(COMMAND_LINES + configs)]
    run = run_python(pods("bare", **H100), VLLM_PARSE, {"TMAGUARD_MODE": "off"}, args=lines)
    assert run.returncode == 0, run.stderr[-3000:]
    (result,) = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    parsed = json.loads(result.removeprefix("RESULT "))
    assert len(parsed) == len(COMMAND_LINES) + len(configs)
    for line, vllm in zip(COMMAND_LINES, parsed[: len(COMMAND_LINES)], strict=True):
        flag = eager_flag(["vllm", "serve", "MODEL", *line])
        assert (flag is not None) == _runs_eager(vllm), (line, vllm, flag)
        assert flag is None or flag.replace("'", "") in " ".join(line), (line, flag)  # as written
    for line, text, vllm in zip(configs, written, parsed[len(COMMAND_LINES) :], strict=True):
        flag = process_eager_flag(["vllm", "serve", "MODEL", *line])
        assert (flag is not None) == _runs_eager(vllm), (text, line[2:], vllm, flag)
        if flag is not None and len(line) == 2:  # the file alone made it eager: the flag says where
            assert flag.endswith(f" (in --config {line[1]})"), flag


def _read_in_a_child(path: Path) -> str | None:
    """process_eager_flag on `--config PATH` in a fresh process: a read that blocked, or a structure printed
    whole, fails the test by the timeout instead of hanging the suite."""
    code = (
        "import json, sys\nfrom vllm_tmaguard.launch_file import process_eager_flag\n"
        "print(json.dumps(process_eager_flag(['vllm', 'serve', 'M', '--config', sys.argv[1]])))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(run.stdout)


def _waiting_for_a_reader(pid: int) -> bool:
    """Whether process `pid` sleeps in a FIFO's open for writing (the kernel's wait_for_partner), polled until
    it does (its start) or exits; once released from that wait it never sleeps there again."""
    for _ in range(400):
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if wchan == "wait_for_partner" and state == "S":
            return True
        time.sleep(0.025)  # the writer is still starting
    return False


def test_a_config_file_the_guard_must_not_read_counts_as_none(tmp_path) -> None:
    """A FIFO is never opened (its writer would be released to vLLM's loss), a file past MAX_BYTES or not
    YAML vLLM can load is no file, and a YAML structure of aliases is never printed whole."""
    fifo = tmp_path / "serve.yaml"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'w').write('vLLM reads this')"])
    try:
        assert _waiting_for_a_reader(writer.pid)
        assert _read_in_a_child(fifo) is None
        assert _waiting_for_a_reader(writer.pid)  # never released: the guard did not open the FIFO
        assert fifo.read_text() == "vLLM reads this"  # what vLLM, opening it next, would get
    finally:
        writer.kill()
        writer.wait()
    huge = tmp_path / "huge.yaml"
    huge.write_text("enforce_eager: true\n" + "#" * MAX_BYTES + "\n")
    assert _read_in_a_child(huge) is None
    wrong_suffix = tmp_path / "serve.json"  # vLLM refuses any but .yaml/.yml
    wrong_suffix.write_text("enforce_eager: true\n")
    assert _read_in_a_child(wrong_suffix) is None
    deep = tmp_path / "deep.yaml"
    deep.write_text("enforce_eager: true\nx: " + "[" * 20000 + "]" * 20000 + "\n")
    assert _read_in_a_child(deep) is None
    not_a_mapping = tmp_path / "list.yml"
    not_a_mapping.write_text("- enforce_eager\n")
    assert _read_in_a_child(not_a_mapping) is None
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    aliases = tmp_path / "aliases.yaml"
    bomb += ["compilation-config: {cudagraph_mode: *a8}", "optimization-level: *a8"]  # 10^9 leaves each
    aliases.write_text("\n".join(bomb))
    assert _read_in_a_child(aliases) is None
    linked = tmp_path / "linked.yaml"  # the operator's own file through a link: read, as vLLM reads it
    (tmp_path / "real.yaml").write_text("enforce_eager: true\n")
    linked.symlink_to(tmp_path / "real.yaml")
    assert _read_in_a_child(linked) == f"--enforce_eager (in --config {linked})"


def test_an_eager_config_file_under_a_network_layer_routes_to_marlin(pods, run_python, tmp_path) -> None:
    """The guard alone, with the file and with --enforce-eager: the same routing, so vLLM's selectors choose
    as under --enforce-eager (Marlin: test_eager_under_a_network_layer_routes_w4a16_to_marlin)."""
    config = tmp_path / "serve.yaml"
    config.write_text("seed: 0\nenforce_eager: true\n")
    pod = pods("lupine-client", **H100)
    code = GUARD_ONLY + "import os, json\nprint('RESULT ' + json.dumps({'pid': os.getpid()}))\n"
    from_file = run_python(pod, code, args=["--config", str(config)], records="file")
    flag = run_python(pod, code, args=["--enforce-eager"], records="flag")
    record, flagged = (run.record_of(run.result["pid"]) for run in (from_file, flag))
    assert record["routing"]["env"] == flagged["routing"]["env"] and record["actions"] == flagged["actions"]
    assert "MacheteLinearKernel" in record["routing"]["env"]["VLLM_DISABLED_KERNELS"].split(",")
    mixed = next(f for f in record["routing"]["families"] if f["family"] == "mixed-precision linear")
    assert f"{ROUND_TRIPS} (--enforce_eager (in --config {config}))" in mixed["why"]


def test_a_changed_config_file_is_not_replayed(pods, run_python, tmp_path) -> None:
    """The file's eager setting is read in every process: one whose file no longer says eager does not
    replay the eager verdict."""
    pod = pods("lupine-client", **H100)
    config = tmp_path / "serve.yaml"
    config.write_text("enforce_eager: true\n")
    code = GUARD_ONLY + "import os, json\nprint('RESULT ' + json.dumps({'pid': os.getpid()}))\n"
    first = run_python(pod, code, args=["--config", str(config)])
    stored = first.record_of(first.result["pid"])
    assert "MacheteLinearKernel" in stored["routing"]["env"].get("VLLM_DISABLED_KERNELS", "")
    config.write_text("enforce_eager: false\n")
    later = run_python(pod, code, args=["--config", str(config)])
    changed = later.record_of(later.result["pid"])
    assert changed["replayed_from"] is None
    assert "MacheteLinearKernel" not in changed["routing"]["env"].get("VLLM_DISABLED_KERNELS", "")


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
    """The guard alone: eager on a local driver routes nothing, so vLLM's selectors, which read the
    environment and not the command line, choose what they choose on this pod unrouted: Machete
    (test_routing.py's test_gemm_hopper_and_auto_keep_the_tma_path_on_a_complete_driver)."""
    code = GUARD_ONLY + "import os, json\nprint('RESULT ' + json.dumps({'pid': os.getpid()}))\n"
    run = run_python(pods("bare", **H100), code, args=["-cc", '{"cudagraph_mode": "NONE"}'])
    record = run.record_of(run.result["pid"])
    knobs = {k: v for k, v in record["routing"]["env"].items() if k not in ray_env.ENV_NAMES}
    assert knobs == {} and record["routing"]["blocked_imports"] == [] and record["actions"] == []
    mixed = next(f for f in record["routing"]["families"] if f["family"] == "mixed-precision linear")
    assert mixed["path"] == "vLLM's choice: Machete (sm_90 TMA)"
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
