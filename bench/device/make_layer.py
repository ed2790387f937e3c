"""Generates a forwarding stand-in for a GPU-sharing layer from the real driver's .dynsym (docs/design.md
§6.2): one `lock incq count; jmp *table` trampoline per exported cu* name, the table filled by dlsym in a
constructor, minus what the layer's shape lacks. Its cuGetProcAddress answers hooked names with its own
trampolines and passes the rest to the real driver, as vCUDA does. SONAME libcuda-control.so. Shapes:
  upstream  tkestack vCUDA built against old headers: lacks cuGetProcAddress_v2, cuLaunchKernelEx and the
            tensor-map encoders; exports a v1 cuGetProcAddress
  gpa-v2    exports cuGetProcAddress and cuGetProcAddress_v2 (both forwarding unknown names) and
            cuLaunchKernelEx, lacks only the encoders
  no-gpa    built against headers older than CUDA 11.3: no cuGetProcAddress of either version, no
            cuLaunchKernelEx, no encoders
  network   like upstream, but its look-up refuses the encoders (a network layer has no local driver to
            ask), so no real encoder is reachable through it

usage: make_layer.py REAL_DRIVER OUTPUT.so [SHAPE]   (REAL_DRIVER: the path the layer dlopens at run time)"""

from __future__ import annotations

import subprocess
import sys

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from vllm_tmaguard.stages.elf import read_elf

ENCODERS = (
    "cuTensorMapEncodeTiled",
    "cuTensorMapEncodeIm2col",
    "cuTensorMapEncodeIm2colWide",
    "cuTensorMapReplaceAddress",
)
UPSTREAM = ("cuGetProcAddress_v2", "cuLaunchKernelEx", *ENCODERS)
SHAPES = {  # shape: (names it lacks, which cuGetProcAddress versions it exports, look-ups it refuses)
    "upstream": (UPSTREAM, ("v1",), ()),
    "gpa-v2": (ENCODERS, ("v1", "v2"), ()),
    "no-gpa": (UPSTREAM, (), ()),
    "network": (UPSTREAM, ("v1",), ("cuTensorMap",)),
}


def source(names: list[str], real_driver: str, versions: tuple[str, ...], refused: tuple[str, ...]) -> str:
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
{"EXPORT int g_vcuda_config[4];" if not refused else "/* a network layer: no vCUDA fingerprint */"}
static long long proc_address_calls;
typedef int (*gpa_fn)(const char *, void **, int, unsigned long long);
static gpa_fn real_gpa;
static void *real_handle;
static int missing(void) {{ return 34; /* CUDA_ERROR_STUB_LIBRARY */ }}

__attribute__((constructor)) static void init(void) {{
    void *real = dlopen("{real_driver}", RTLD_NOW | RTLD_LOCAL);
    if (!real) {{ fprintf(stderr, "layer: %s\\n", dlerror()); abort(); }}
    for (int i = 0; i < N; i++) {{
        layer_table[i] = dlsym(real, names[i]);
        if (!layer_table[i]) layer_table[i] = (void *)missing;
    }}
    real_gpa = (gpa_fn)dlsym(real, "cuGetProcAddress");
    real_handle = real;
}}

static int refused(const char *symbol) {{
    static const char *const prefixes[] = {{{", ".join(f'"{p}"' for p in refused) or "NULL"}}};
    for (unsigned i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (prefixes[i] && strncmp(symbol, prefixes[i], strlen(prefixes[i])) == 0) return 1;
    return 0;
}}

static void *hooked(void *fn) {{
    for (int i = 0; i < N; i++) if (layer_table[i] == fn) return trampolines[i];
    return fn;
}}

{"EXPORT" if "v1" in versions else "static __attribute__((unused))"}
int cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {{
    __atomic_fetch_add(&proc_address_calls, 1, __ATOMIC_RELAXED);
    if (refused(symbol)) {{ if (pfn) *pfn = NULL; return 500; /* CUDA_ERROR_NOT_FOUND */ }}
    int result = real_gpa(symbol, pfn, version, flags);
    if (result == 0 && pfn && *pfn) *pfn = hooked(*pfn);
    return result;
}}

typedef int (*gpa2_fn)(const char *, void **, int, unsigned long long, int *);
{"EXPORT" if "v2" in versions else "static __attribute__((unused))"}
int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                        int *status) {{
    __atomic_fetch_add(&proc_address_calls, 1, __ATOMIC_RELAXED);
    if (refused(symbol)) {{ if (pfn) *pfn = NULL; if (status) *status = 1; return 500; }}
    gpa2_fn real_v2 = (gpa2_fn)dlsym(real_handle, "cuGetProcAddress_v2");
    int result = real_v2(symbol, pfn, version, flags, status);
    if (result == 0 && pfn && *pfn) *pfn = hooked(*pfn);
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
    shape = sys.argv[3] if len(sys.argv) > 3 else "upstream"
    lacking, versions, refused = SHAPES[shape]
    exported = read_elf(real_driver, prefixes=(b"cu",)).defined
    names = sorted(
        n for n in exported if n[2:3].isupper() and not n.startswith(("cuGetProcAddress", *lacking))
    )
    c_file = output + ".c"
    with open(c_file, "w") as file:
        file.write(source(names, real_driver, versions, refused))
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
            "-Wl,-soname," + ("libcuda.so.1" if refused else "libcuda-control.so"),
            "-o",
            output,
            c_file,
            "-ldl",
        ],
        check=True,
    )
    gpa = ", ".join(f"cuGetProcAddress {v}" for v in versions) or "no cuGetProcAddress"
    print(f"{output} ({shape}): {len(names)} forwarded entry points; {gpa}; lacking {', '.join(lacking)}")


if __name__ == "__main__":
    main()
