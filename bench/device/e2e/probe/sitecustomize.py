"""The device run's quota probe, in every Python process of a served pod (this directory first on PYTHONPATH,
E2E_PROBE_DIR set): each process notes its pid; on SIGWINCH it answers, from its main thread (where vLLM set
the process's CUDA device), what `cudaMemGetInfo` shows it and whether an allocation of E2E_PROBE_BYTES past
the layer's limit is refused. serve_pods.py signals the noted pids once the server has answered its prompts
(the engine idle). SIGWINCH, not SIGUSR1/2: HAMi-core takes those for its own suspend and resume, and a
process without this handler ignores SIGWINCH. Bench code: never part of the package."""

import json
import os
import signal
import sys

_DIR = os.environ.get("E2E_PROBE_DIR")


def _note_pid() -> None:
    with open(os.path.join(_DIR, f"pid-{os.getpid()}"), "w") as file:
        file.write(" ".join(sys.argv[:4]))


def _answer(signum: int, frame: object) -> None:
    result: dict = {"pid": os.getpid(), "argv": sys.argv[:4]}
    try:
        with open("/proc/self/cmdline", "rb") as file:
            result["title"] = file.read().split(b"\0")[0].decode(errors="replace")[:80]
        torch = sys.modules.get("torch")
        result["cuda"] = bool(torch is not None and torch.cuda.is_initialized())
        if result["cuda"]:
            device = torch.cuda.current_device()
            free, total = torch.cuda.mem_get_info(device)
            result.update(device=device, free=free, total=total, reserved=torch.cuda.memory_reserved(device))
            size = int(os.environ.get("E2E_PROBE_BYTES", str(10 << 30)))
            result["asked"] = size
            try:
                block = torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}")
                result["past_limit"] = "allocated"
                del block
                torch.cuda.empty_cache()
            except torch.OutOfMemoryError as error:
                result["past_limit"] = "refused"
                result["error"] = str(error).splitlines()[0][:200]
    except Exception as error:  # a probe that fails is a result too
        result["probe_error"] = f"{type(error).__name__}: {error}"[:300]
    with open(os.path.join(_DIR, f"result-{os.getpid()}.json"), "w") as file:
        json.dump(result, file)


if _DIR and os.path.isdir(_DIR):
    _note_pid()
    signal.signal(signal.SIGWINCH, _answer)
    os.register_at_fork(after_in_child=_note_pid)
