"""Armed by vllm_tmaguard.pth at interpreter start. Runs the guard when `vllm` is first imported: vLLM
versions without platform plugins import their CUDA extension before any plugin of theirs runs. Until
then it costs one string comparison per import; afterwards it is gone from sys.meta_path."""

import sys


class VllmImportHook:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "vllm":
            return None
        disarm()
        try:
            from vllm_tmaguard.guard import activate

            activate("import-hook")
        except Exception:
            pass
        return None  # let the normal finders import vllm


def disarm() -> None:
    sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not VllmImportHook]


def arm() -> None:
    if VllmImportHook not in sys.meta_path and "vllm" not in sys.modules:
        sys.meta_path.insert(0, VllmImportHook)


arm()
