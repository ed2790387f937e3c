"""Generates a forwarding stand-in for a GPU-sharing layer from the real driver's .dynsym (docs/design.md
§6.2): one `lock incq count; jmp *table` trampoline per exported cu* name, the table filled by dlsym in a
constructor, minus what an upstream vCUDA built against old headers lacks (cuGetProcAddress_v2,
cuLaunchKernelEx, the tensor-map encoders). Its v1 cuGetProcAddress answers hooked names with its own
trampolines and passes the rest to the real driver, as vCUDA does. SONAME libcuda-control.so.

usage: make_layer.py REAL_DRIVER OUTPUT.so   (REAL_DRIVER: the path the layer will dlopen at run time)"""

from __future__ import annotations

import subprocess
import sys

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from vllm_tmaguard.elf import read_elf

LACKING = (
    "cuGetProcAddress_v2",
    "cuLaunchKernelEx",
    "cuTensorMapEncodeTiled",
    "cuTensorMapEncodeIm2col",
    "cuTensorMapEncodeIm2colWide",
    "cuTensorMapReplaceAddress",
)


def source(names: list[str], real_driver: str) -> str:
    trampolines = "".join(
        f'".globl {n}\\n.type {n},@function\\n.p2align 4\\n{n}:\\ntmg_t{i}:\\n'
        f"\\tlock incq layer_counts+{8 * i}(%rip)\\n\\tjmp *layer_table+{8 * i}(%rip)\\n"
        f'.size {n}, .-{n}\\n"\n'
        for i, n in enumerate(names)
    )
    labels = ", ".join(f"tmg_t{i}" for i in range(len(names)))
    quoted = ", ".join(f'"{n}"' for n in names)
    return f"""#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define N {len(names)}
#define EXPORT __attribute__((visibility("default")))
static const char *const names[N] = {{{quoted}}};
__attribute__((visibility("hidden"))) void *layer_table[N];
__attribute__((visibility("hidden"))) long long layer_counts[N];
extern char {labels.replace(", ", "[], ")}[];
static void *const trampolines[N] = {{{labels}}};
__asm__(".text\\n"
{trampolines});
EXPORT int g_vcuda_config[4];
static long long proc_address_calls;
typedef int (*gpa_fn)(const char *, void **, int, unsigned long long);
static gpa_fn real_gpa;
static int missing(void) {{ return 34; /* CUDA_ERROR_STUB_LIBRARY */ }}

__attribute__((constructor)) static void init(void) {{
    void *real = dlopen("{real_driver}", RTLD_NOW | RTLD_LOCAL);
    if (!real) {{ fprintf(stderr, "layer: %s\\n", dlerror()); abort(); }}
    for (int i = 0; i < N; i++) {{
        layer_table[i] = dlsym(real, names[i]);
        if (!layer_table[i]) layer_table[i] = (void *)missing;
    }}
    real_gpa = (gpa_fn)dlsym(real, "cuGetProcAddress");
}}

EXPORT int cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {{
    __atomic_fetch_add(&proc_address_calls, 1, __ATOMIC_RELAXED);
    int result = real_gpa(symbol, pfn, version, flags);
    if (result == 0 && pfn && *pfn)
        for (int i = 0; i < N; i++)
            if (layer_table[i] == *pfn) {{ *pfn = trampolines[i]; break; }}
    return result;
}}

EXPORT long long layer_calls(const char *name) {{
    if (strcmp(name, "cuGetProcAddress") == 0) return proc_address_calls;
    for (int i = 0; i < N; i++) if (strcmp(names[i], name) == 0) return layer_counts[i];
    return -1;
}}
"""


def main() -> None:
    real_driver, output = sys.argv[1], sys.argv[2]
    exported = read_elf(real_driver, prefixes=(b"cu",)).defined
    names = sorted(
        n for n in exported if n[2:3].isupper() and n != "cuGetProcAddress" and not n.startswith(LACKING)
    )
    c_file = output + ".c"
    with open(c_file, "w") as file:
        file.write(source(names, real_driver))
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
            "-Wl,-soname,libcuda-control.so",
            "-o",
            output,
            c_file,
            "-ldl",
        ],
        check=True,
    )
    print(f"{output}: {len(names)} forwarded entry points, lacking {', '.join(LACKING)}")


if __name__ == "__main__":
    main()
