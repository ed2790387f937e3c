"""Builds the C shims and overlays as plain shared libraries (dlopen-ed, not imported) and installs the
.pth hook. See vllm_tmaguard/csrc/tmaguard_shim.c for what the feature groups are."""

import itertools
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

SOURCE = "vllm_tmaguard/csrc/tmaguard_shim.c"
COMPILE_ARGS = ["-O2", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror", "-std=gnu11"]
# The overlay's DT_NEEDED on the layer: a fixed-length path the guard overwrites with the layer's absolute
# path at run time (vllm_tmaguard/overlay.py has the same constants).
PLACEHOLDER = "/tmaguard-layer-placeholder/" + "x" * 220
GROUPS = {"enc": "TMAGUARD_ENCODERS", "pa2": "TMAGUARD_PROC_ADDRESS_V2", "lex": "TMAGUARD_LAUNCH_EX"}


def library(name: str, defines: list[str], soname: str) -> Extension:
    return Extension(
        f"vllm_tmaguard.lib.{name}",
        sources=[SOURCE],
        define_macros=[(d, "1") for d in defines],
        extra_compile_args=COMPILE_ARGS,
        extra_link_args=[f"-Wl,-soname,{soname}", "-Wl,-z,now"],
        libraries=["dl", "pthread"],
    )


def overlay(codes: tuple[str, ...]) -> Extension:
    ext = library(
        f"libtmaguard_overlay_{'-'.join(codes)}",
        [GROUPS[c] for c in codes] + ["TMAGUARD_OVERLAY"],
        "libcuda.so.1",
    )
    ext.define_macros.append(("TMAGUARD_LAYER_PLACEHOLDER", f'"{PLACEHOLDER}"'))
    return ext


class BuildSharedLibraries(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return []

    def build_extension(self, ext: Extension) -> None:
        if "overlay" in ext.name:
            ext.extra_link_args += ["-Wl,--no-as-needed", self._placeholder_library()]
        super().build_extension(ext)

    def _placeholder_library(self) -> str:
        """An empty library whose SONAME is the placeholder: linking against it records it as DT_NEEDED."""
        path = os.path.join(self.build_temp, "libtmaguard_placeholder.so")
        if not os.path.exists(path):
            os.makedirs(self.build_temp, exist_ok=True)
            source = os.path.join(self.build_temp, "placeholder.c")
            with open(source, "w") as file:
                file.write("int tmaguard_placeholder;\n")
            objects = self.compiler.compile([source], output_dir=self.build_temp, extra_postargs=["-fPIC"])
            self.compiler.link_shared_object(objects, path, extra_postargs=[f"-Wl,-soname,{PLACEHOLDER}"])
        return path


class BuildWithPthHook(build_py):
    """Puts vllm_tmaguard.pth at the top of site-packages: it arms the import hook for old vLLM."""

    def run(self) -> None:
        super().run()
        self.copy_file("vllm_tmaguard.pth", os.path.join(self.build_lib, "vllm_tmaguard.pth"))


subsets = [c for n in range(1, 4) for c in itertools.combinations(GROUPS, n)]
setup(
    ext_modules=[
        library("libtmaguard_encoders", ["TMAGUARD_ENCODERS"], "libtmaguard_encoders.so"),
        library("libtmaguard_proc_address", ["TMAGUARD_PROC_ADDRESS_V2"], "libtmaguard_proc_address.so"),
        *(overlay(codes) for codes in subsets),
    ],
    cmdclass={"build_ext": BuildSharedLibraries, "build_py": BuildWithPthHook},
)
