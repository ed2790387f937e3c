/*
 * Stand-in for HAMi-core's libvgpu.so, loaded with LD_PRELOAD: hooks
 * cuMemAlloc_v2 and cuLaunchKernel in the global scope, counts the calls and
 * forwards them to the next definition (the real libcuda.so.1).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "standin_entry_points.h"

static long long g_mem_alloc_calls;
static long long g_launch_calls;

/*
 * RTLD_NEXT only sees the global scope; if libcuda.so.1 was opened
 * RTLD_LOCAL (ctypes' default) fall back to opening it, as HAMi-core does.
 */
static void *resolve(const char *name) {
    void *f = dlsym(RTLD_NEXT, name);
    if (!f) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (h)
            f = dlsym(h, name);
    }
    return f;
}

static CUresult forward(void **cache, const char *name, STANDIN_GENERIC_PARAMS) {
    void *f = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (!f) {
        f = resolve(name);
        if (!f)
            return CUDA_ERROR_STUB_LIBRARY;
        __atomic_store_n(cache, f, __ATOMIC_RELEASE);
    }
    return ((standin_generic_fn)f)(STANDIN_GENERIC_ARGS);
}

STANDIN_EXPORT CUresult cuMemAlloc_v2(STANDIN_GENERIC_PARAMS) {
    static void *real;
    __atomic_fetch_add(&g_mem_alloc_calls, 1, __ATOMIC_RELAXED);
    return forward(&real, "cuMemAlloc_v2", STANDIN_GENERIC_ARGS);
}

STANDIN_EXPORT CUresult cuLaunchKernel(STANDIN_GENERIC_PARAMS) {
    static void *real;
    __atomic_fetch_add(&g_launch_calls, 1, __ATOMIC_RELAXED);
    return forward(&real, "cuLaunchKernel", STANDIN_GENERIC_ARGS);
}

STANDIN_EXPORT long long standin_vgpu_calls(const char *name) {
    if (name && strcmp(name, "cuMemAlloc_v2") == 0)
        return __atomic_load_n(&g_mem_alloc_calls, __ATOMIC_RELAXED);
    if (name && strcmp(name, "cuLaunchKernel") == 0)
        return __atomic_load_n(&g_launch_calls, __ATOMIC_RELAXED);
    return -1;
}

STANDIN_EXPORT int standin_is_vgpu(void) { return 1; }
