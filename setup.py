"""Builds the C shims as plain shared libraries (dlopen-ed, not imported) and installs the .pth hook."""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

SHIM_SOURCE = "vllm_tmaguard/csrc/tmaguard_shim.c"
COMPILE_ARGS = ["-O2", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror", "-std=gnu11"]


def shim(name: str, define: str) -> Extension:
    return Extension(
        f"vllm_tmaguard.lib.{name}",
        sources=[SHIM_SOURCE],
        define_macros=[(define, "1")],
        extra_compile_args=COMPILE_ARGS,
        extra_link_args=[f"-Wl,-soname,{name}.so", "-Wl,-z,now"],
        libraries=["dl", "pthread"],
    )


class BuildSharedLibraries(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return []


class BuildWithPthHook(build_py):
    """Puts vllm_tmaguard.pth at the top of site-packages: it arms the import hook for old vLLM."""

    def run(self) -> None:
        super().run()
        self.copy_file("vllm_tmaguard.pth", os.path.join(self.build_lib, "vllm_tmaguard.pth"))


setup(
    ext_modules=[
        shim("libtmaguard_encoders", "TMAGUARD_ENCODERS"),
        shim("libtmaguard_proc_address", "TMAGUARD_PROC_ADDRESS_V2"),
    ],
    cmdclass={"build_ext": BuildSharedLibraries, "build_py": BuildWithPthHook},
)
