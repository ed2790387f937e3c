"""Builds the C overlay and shims as plain shared libraries (dlopen-ed, not imported) and installs the
.pth hook. See vllm_tmaguard/csrc/tmaguard.h for what each library is made of.

The libraries are not Python extensions: one wheel per architecture serves every CPython, tagged
py3-none-<platform> (scripts/build_wheels.sh builds the manylinux_2_28 ones)."""

import os

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

CSRC = "vllm_tmaguard/csrc"
HERE = os.path.dirname(os.path.abspath(__file__))
HEADERS = [os.path.join(HERE, CSRC, h) for h in ("tmaguard.h", "proc_versions.h", "driver_symbols.h")]
# Binds glibc's dl* functions to versions glibc 2.28 has (see the header).
GLIBC_COMPAT = os.path.join(HERE, CSRC, "glibc_compat.h")
COMPILE_ARGS = ["-O2", "-g0", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror", "-std=gnu11"]
COMPILE_ARGS += ["-include", GLIBC_COMPAT]
# The overlay's dependency on the layer: a fixed-length path the guard overwrites with the layer's absolute
# path at run time (vllm_tmaguard/stages/overlay.py has the same constant).
PLACEHOLDER = "/tmaguard-layer-placeholder/" + "x" * 220


def library(name: str, groups: list[str], defines: list[str], soname: str) -> Extension:
    return Extension(
        f"vllm_tmaguard.lib.{name}",
        sources=[f"{CSRC}/{group}.c" for group in ["common", *groups]],
        depends=[GLIBC_COMPAT, *HEADERS, os.path.abspath(__file__)],  # rebuilt when these change
        define_macros=[(d, "1") for d in defines],
        extra_compile_args=COMPILE_ARGS,
        # libdl.so.2 by name: an older glibc exports dlopen & co. there, not in libc.so.6 (a newer one
        # keeps libdl.so.2 as an empty compatibility library).
        extra_link_args=[f"-Wl,-soname,{soname}", "-Wl,-z,now", "-Wl,--no-as-needed", "-l:libdl.so.2"],
        libraries=["pthread"],
    )


def overlay() -> Extension:
    ext = library(
        "libtmaguard_overlay",
        ["entry_points", "proc_address", "launch_ex"],
        ["TMAGUARD_OVERLAY"],
        "libcuda.so.1",
    )
    ext.define_macros.append(("TMAGUARD_LAYER_PLACEHOLDER", f'"{PLACEHOLDER}"'))
    # The placeholder as an optional filter (DT_AUXILIARY), not DT_NEEDED: the file as shipped needs nothing
    # outside the manylinux policy; vllm_tmaguard/stages/overlay.py makes it DT_NEEDED on the layer's file.
    ext.extra_link_args.append(f"-Wl,--auxiliary,{PLACEHOLDER}")
    return ext


class BuildSharedLibraries(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return []

    def build_extensions(self) -> None:
        # Libraries loaded by path: no run path or library directory of the Python that builds them.
        self.compiler.linker_so = [
            arg for arg in self.compiler.linker_so if not arg.startswith(("-L", "-Wl,-rpath", "-Wl,-R"))
        ]
        super().build_extensions()


class BuildWithPthHook(build_py):
    """Puts vllm_tmaguard.pth at the top of site-packages: it arms the import hook for old vLLM."""

    def run(self) -> None:
        super().run()
        self.copy_file("vllm_tmaguard.pth", os.path.join(self.build_lib, "vllm_tmaguard.pth"))


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: the libraries do not depend on the Python version or ABI."""

    def get_tag(self) -> tuple[str, str, str]:
        return ("py3", "none", super().get_tag()[2])


setup(
    ext_modules=[
        library("libtmaguard_encoders", ["entry_points"], [], "libtmaguard_encoders.so"),
        library("libtmaguard_proc_address", ["proc_address"], [], "libtmaguard_proc_address.so"),
        overlay(),
    ],
    cmdclass={"build_ext": BuildSharedLibraries, "build_py": BuildWithPthHook, "bdist_wheel": PlatformWheel},
)
