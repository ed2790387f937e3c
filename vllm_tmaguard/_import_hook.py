"""Armed by vllm_tmaguard.pth at interpreter start. Runs the guard when `vllm` is first imported (vLLM
versions without platform plugins import their CUDA extension before any plugin of theirs runs), or earlier,
when `torch` is imported first in an environment where vLLM is installed and libcuda.so.1 lacks what the
guard supplies: torch maps libcuda.so.1, and the overlay must become it before that (early.py). Until then
it costs two string comparisons per import; afterwards it is gone from sys.meta_path."""

import sys


class VllmImportHook:
    torch_checked = False

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "vllm":
            _activate("import-hook")
        elif name == "torch" and not cls.torch_checked:
            cls.torch_checked = True
            try:
                from vllm_tmaguard.stages.early import torch_first_needs_guard

                if torch_first_needs_guard():
                    _activate("import-hook (torch imported first)")
            except Exception:
                pass
        return None  # let the normal finders import the module


def _activate(trigger: str) -> None:
    disarm()
    try:
        from vllm_tmaguard.guard import activate

        activate(trigger)
    except Exception:
        pass


def disarm() -> None:
    sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not VllmImportHook]


def arm() -> None:
    if VllmImportHook not in sys.meta_path and "vllm" not in sys.modules:
        sys.meta_path.insert(0, VllmImportHook)


arm()
