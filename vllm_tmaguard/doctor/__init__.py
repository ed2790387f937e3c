"""`tmaguard doctor`: the cause of a failing vLLM pod and the exact fix, in well under a second.

Passive by default: reads files, the environment and ELF tables through the guard's own probes (facts.py,
vllm_probe.py, consumers.py, fatbin.py); never imports torch or vLLM and never initialises CUDA in this
process. NVML is asked in a child process with a time limit (a sharing layer's NVML may hang or exit).
`--active` adds child processes that initialise CUDA through the pod's own libcuda.so.1 and encode a tensor
map on a real allocation. The report is a dict with a versioned schema (docs/doctor.md).

Modules, each one job:
- gather: the report: what the probes find here (hooks: whether the guard runs in vLLM processes and its last
  record; binaries: vLLM's GPU code and who asks libcuda.so.1 for what; children: NVML and --active in child
  processes, child: what runs there)
- findings: the findings, the status and the merged fix, pure functions of the gathered report
- render: the report for people (text) and for programs (JSON)
- command: the command line; constants: what the modules and the child processes agree on

This file stays free of imports: the child processes import vllm_tmaguard.doctor.child through it."""

from __future__ import annotations


def main(argv: list[str]) -> int:
    """`tmaguard doctor ARGS`; returns the exit status."""
    from .command import main as run

    return run(argv)
