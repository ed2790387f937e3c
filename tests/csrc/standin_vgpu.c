/*
 * Stand-in for HAMi-core's libvgpu.so, preloaded (LD_PRELOAD or /etc/ld.so.preload) in front of NVIDIA's
 * own libcuda.so.1, which stays in place:
 * - hooks cuMemAlloc_v2 (against CUDA_DEVICE_MEMORY_LIMIT_0), cuMemGetInfo_v2 (answers with the limit) and
 *   cuLaunchKernel in the global scope, counts the calls and forwards them to the real libcuda.so.1;
 * - overrides dlsym for the whole process, as HAMi-core does: a look-up of a name it hooks, on any handle,
 *   gets its hook; the first look-up of a cu* name initialises its shared state (a line in
 *   $STANDIN_VGPU_STATE stands for the shared memory region it creates).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "standin_entry_points.h"

static long long g_mem_alloc_calls;
static long long g_launch_calls;
static unsigned long long g_used;
static int g_initialised;

#include "standin_dlsym.h"

static void initialise_shared_state(void) {
    if (__atomic_exchange_n(&g_initialised, 1, __ATOMIC_ACQ_REL))
        return;
    const char *state = getenv("STANDIN_VGPU_STATE");
    FILE *file = state && *state ? fopen(state, "a") : NULL;
    if (file) {
        fprintf(file, "init pid %d\n", (int)getpid());
        fclose(file);
    }
}

/* The real libcuda.so.1's function: RTLD_NEXT sees only the global scope, so open it as HAMi-core does. */
static void *resolve(const char *name) {
    void *f = real_dlsym()(RTLD_NEXT, name);
    if (!f) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (h)
            f = real_dlsym()(h, name);
    }
    return f;
}

static standin_generic_fn forward_to(void **cache, const char *name) {
    void *f = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (!f) {
        f = resolve(name);
        __atomic_store_n(cache, f, __ATOMIC_RELEASE);
    }
    return (standin_generic_fn)f;
}

static unsigned long long memory_limit(void) {
    const char *limit = getenv("CUDA_DEVICE_MEMORY_LIMIT_0");
    if (!limit || !*limit)
        return ~0ULL;
    char *unit;
    unsigned long long value = strtoull(limit, &unit, 10);
    switch (*unit) {
    case 'g': case 'G': return value << 30;
    case 'm': case 'M': return value << 20;
    default: return value;
    }
}

STANDIN_EXPORT CUresult cuMemAlloc_v2(STANDIN_GENERIC_PARAMS) {
    static void *real;
    __atomic_fetch_add(&g_mem_alloc_calls, 1, __ATOMIC_RELAXED);
    unsigned long long size = (unsigned long long)(size_t)a1;
    if (__atomic_load_n(&g_used, __ATOMIC_RELAXED) + size > memory_limit())
        return CUDA_ERROR_OUT_OF_MEMORY;
    standin_generic_fn f = forward_to(&real, "cuMemAlloc_v2");
    CUresult result = f ? f(STANDIN_GENERIC_ARGS) : CUDA_ERROR_STUB_LIBRARY;
    if (result == CUDA_SUCCESS)
        __atomic_fetch_add(&g_used, size, __ATOMIC_RELAXED);
    return result;
}

STANDIN_EXPORT CUresult cuMemGetInfo_v2(STANDIN_GENERIC_PARAMS) {
    static void *real;
    standin_generic_fn f = forward_to(&real, "cuMemGetInfo_v2");
    CUresult result = f ? f(STANDIN_GENERIC_ARGS) : CUDA_ERROR_STUB_LIBRARY;
    unsigned long long limit = memory_limit();
    if (result == CUDA_SUCCESS && a0 && a1 && limit != ~0ULL) {
        *(unsigned long long *)a1 = limit;
        *(unsigned long long *)a0 = limit - __atomic_load_n(&g_used, __ATOMIC_RELAXED);
    }
    return result;
}

STANDIN_EXPORT CUresult cuLaunchKernel(STANDIN_GENERIC_PARAMS) {
    static void *real;
    __atomic_fetch_add(&g_launch_calls, 1, __ATOMIC_RELAXED);
    standin_generic_fn f = forward_to(&real, "cuLaunchKernel");
    return f ? f(STANDIN_GENERIC_ARGS) : CUDA_ERROR_STUB_LIBRARY;
}

/* The process-wide look-up HAMi-core installs. */
STANDIN_EXPORT void *dlsym(void *handle, const char *symbol) {
    if (strncmp(symbol, "cu", 2) == 0) {
        initialise_shared_state();
        if (strcmp(symbol, "cuMemAlloc_v2") == 0)
            return (void *)cuMemAlloc_v2;
        if (strcmp(symbol, "cuMemGetInfo_v2") == 0)
            return (void *)cuMemGetInfo_v2;
        if (strcmp(symbol, "cuLaunchKernel") == 0)
            return (void *)cuLaunchKernel;
    }
    return real_dlsym()(handle, symbol);
}

STANDIN_EXPORT long long standin_vgpu_calls(const char *name) {
    if (name && strcmp(name, "cuMemAlloc_v2") == 0)
        return __atomic_load_n(&g_mem_alloc_calls, __ATOMIC_RELAXED);
    if (name && strcmp(name, "cuLaunchKernel") == 0)
        return __atomic_load_n(&g_launch_calls, __ATOMIC_RELAXED);
    return -1;
}

STANDIN_EXPORT int standin_is_vgpu(void) { return 1; }
