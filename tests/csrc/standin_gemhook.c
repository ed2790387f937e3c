/*
 * Stand-in for KubeShare's Gemini hook, libgemhook.so.1 (NTHU-LSALAB/Gemini 953052b, as KubeShare a862311
 * mounts it at /kubeshare/library and preloads it into every container of a shared-GPU pod): no SONAME; its
 * load-time initialiser opens the driver through glibc's private __libc_dlopen_mode and finds dlsym through
 * __libc_dlsym, both gone from libc.so.6 since glibc 2.34. On such a glibc, every process it is preloaded
 * into stops at start-up with `symbol lookup error: ...: undefined symbol: __libc_dlopen_mode` (exit 127),
 * before any code of the program runs. It exports the names it hooks (dlsym, and the cu* hooks of its CUDA
 * 11.2 build, which forward to the driver here): what the fingerprints read.
 *
 * Only ever loaded inside a test's own subprocess: never put on this machine's preload.
 */
#include <stddef.h>

#include "standin_entry_points.h"

extern void *__libc_dlopen_mode(const char *name, int mode);
extern void *__libc_dlsym(void *handle, const char *name);

static void *g_libdl, *g_libcuda;

__attribute__((constructor)) static void load_libraries(void) {
    g_libdl = __libc_dlopen_mode("libdl.so.2", 1 /* RTLD_LAZY */);
    g_libcuda = __libc_dlopen_mode("libcuda.so.1", 1);
}

STANDIN_EXPORT void *dlsym(void *handle, const char *symbol) {
    void *(*real)(void *, const char *) = (void *(*)(void *, const char *))__libc_dlsym(g_libdl, "dlsym");
    return real ? real(handle, symbol) : NULL;
}

#define FORWARD(n)                                                             \
    STANDIN_EXPORT CUresult n(STANDIN_GENERIC_PARAMS) {                        \
        standin_generic_fn fn = (standin_generic_fn)__libc_dlsym(g_libcuda, #n); \
        return fn ? fn(STANDIN_GENERIC_ARGS) : CUDA_ERROR_STUB_LIBRARY;        \
    }
FORWARD(cuMemAlloc_v2)
FORWARD(cuMemGetInfo_v2)
FORWARD(cuLaunchKernel)
FORWARD(cuDeviceTotalMem_v2)
