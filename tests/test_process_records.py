"""One record per vLLM process: the first activation's, and, in a child forked after it (vLLM's EngineCore
and workers under its default fork start method), a record of its own when vLLM loads its plugins there,
through vLLM 0.32.0's real plugin loader."""

from __future__ import annotations

import json
import os
import time

# The parent imports vLLM (the guard runs from the import hook) and forks a child that does what vLLM's
# EngineCore does first: load the general plugins.
FORK_LIKE_ENGINE_CORE = """
import json, os
import vllm
from vllm.plugins import load_general_plugins
child = os.fork()
if child == 0:
    load_general_plugins()
    os._exit(0)
_, status = os.waitpid(child, 0)
print("RESULT " + json.dumps({"parent": os.getpid(), "child": child, "status": status}))
"""


def test_forked_child_writes_its_own_record(pods, run_python) -> None:
    run = run_python(pods("vcuda"), FORK_LIKE_ENGINE_CORE)
    parent, child = run.result["parent"], run.result["child"]
    assert run.result["status"] == 0
    records = {p.name: json.loads(p.read_text()) for p in run.record_dir.glob("process-*.json")}
    assert set(records) == {f"process-{parent}.json", f"process-{child}.json"}, records.keys()

    first, inherited = records[f"process-{parent}.json"], records[f"process-{child}.json"]
    assert first["pid"] == parent and first["trigger"] == "import-hook"
    assert first["record_file"] == str(run.record_dir / f"process-{parent}.json")
    assert inherited["pid"] == child and inherited["forked_from"] == parent
    assert inherited["trigger"].startswith("general-plugin (forked from pid")
    assert inherited["record_file"] == str(run.record_dir / f"process-{child}.json")
    # What the child inherited is what the parent did: the same overlay, the same routing.
    assert inherited["actions"] == first["actions"] and first["actions"][0]["kind"] == "load-overlay"
    assert inherited["routing"] == first["routing"]
    # One line from each process, each naming its own pid.
    pids = sorted(int(line.split("pid=")[1].split(")")[0]) for line in run.guard_lines())
    assert pids == sorted([parent, child])
    assert json.loads((run.record_dir / "last.json").read_text())["pid"] in (parent, child)


def test_process_records_are_bounded(pods, run_python) -> None:
    """Each process adds a file: the directory keeps the newest 64, pruned back to them once 80 are there
    (issue.PROCESS_RECORDS_SLACK: ranking by age stats every record), whatever ran before. (The guard's
    activation alone, as vLLM's import hook runs it: keeping the directory bounded is the guard's write.)"""
    pod = pods("vcuda")
    code = (
        "import json, os\nfrom vllm_tmaguard.guard import activate\nactivate('import-hook')\n"
        "print('RESULT ' + json.dumps(os.getpid()))"
    )
    first = run_python(pod, code)
    stale = [first.record_dir / f"process-{pid}.json" for pid in range(1, 79)]
    now = time.time()
    for pid, path in enumerate(stale, start=1):
        path.write_text("{}")
        os.utime(path, (now - 60 * pid, now - 60 * pid))  # pid N is N minutes old: names do not sort by age
    os.utime(first.record_dir / f"process-{first.result}.json", (now - 86400, now - 86400))
    within = run_python(pod, code)  # 80 records with its own: none removed
    assert len(list(within.record_dir.glob("process-*.json"))) == 80
    os.utime(first.record_dir / f"process-{within.result}.json", (now - 90000, now - 90000))
    run = run_python(pod, code)
    kept = sorted(p.name for p in run.record_dir.glob("process-*.json"))
    assert len(kept) == 64 and f"process-{run.result}.json" in kept
    # The newest 64 by modification time: this process's and the 63 youngest of the others.
    assert set(kept) == {f"process-{run.result}.json", *(f"process-{pid}.json" for pid in range(1, 64))}
