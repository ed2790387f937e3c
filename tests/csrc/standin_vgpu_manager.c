/*
 * Stand-in for vgpu-manager's libvgpu-control.so (coldzerofear/vgpu-manager 3d7f66d), which its device
 * plugin names in the pod's /etc/ld.so.preload (as /etc/vgpu-manager/driver/libvgpu-control.so), in front
 * of NVIDIA's own libcuda.so.1, which stays in place:
 * - exports dlsym for the whole process: a look-up of any cu* name it exports, on any handle (RTLD_NEXT
 *   included), gets its own export;
 * - its cuGetProcAddress_v2 asks the real driver, finds which exact symbol the driver handed out (a
 *   pointer-to-name index over the names it exports, built from the driver's own dlsym), and hands out its
 *   own export of that exact symbol: ("cuMemAlloc", 13000) gets its cuMemAlloc_v2, never a legacy ABI;
 * - meters memory against CUDA_MEM_LIMIT_0 ("8192m"): cuMemAlloc_v2, cuMemAllocAsync and cuMemCreate all
 *   count; cuMemGetInfo_v2 answers min(limit, the GPU's);
 * - counts launches (cuLaunchKernel, cuLaunchKernelEx, cuGraphLaunch: its core limiter's place).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin_entry_points.h"

#define VGPU_EPS(X)                                                            \
    X(cuMemAlloc_v2)                                                           \
    X(cuMemAllocAsync)                                                         \
    X(cuMemCreate)                                                             \
    X(cuMemGetInfo_v2)                                                         \
    X(cuLaunchKernel)                                                          \
    X(cuLaunchKernel_ptsz)                                                     \
    X(cuLaunchKernelEx)                                                        \
    X(cuGraphLaunch)                                                           \
    X(cuMemAlloc)                                                              \
    X(cuGetProcAddress)                                                        \
    X(cuGetProcAddress_v2)

enum {
#define X(n) IDX_##n,
    VGPU_EPS(X)
#undef X
        N_EPS
};

static const char *const g_names[N_EPS] = {
#define X(n) #n,
    VGPU_EPS(X)
#undef X
};

static long long g_calls[N_EPS];
static void *g_real[N_EPS];
static unsigned long long g_used;

#include "standin_dlsym.h"

static void bump(int idx) { __atomic_fetch_add(&g_calls[idx], 1, __ATOMIC_RELAXED); }

static int index_of(const char *name) {
    for (int i = 0; name && i < N_EPS; i++)
        if (strcmp(g_names[i], name) == 0)
            return i;
    return -1;
}

/* The real driver's function: it opens NVIDIA's library itself, RTLD_LOCAL (as the layer does). */
static void *real(int idx) {
    void *fn = __atomic_load_n(&g_real[idx], __ATOMIC_ACQUIRE);
    if (!fn) {
        void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        fn = driver ? real_dlsym()(driver, g_names[idx]) : NULL;
        __atomic_store_n(&g_real[idx], fn, __ATOMIC_RELEASE);
    }
    return fn;
}

static unsigned long long memory_limit(void) {
    const char *limit = getenv("CUDA_MEM_LIMIT_0");
    if (!limit || !*limit)
        return ~0ULL;
    char *unit;
    unsigned long long value = strtoull(limit, &unit, 10);
    return *unit == 'm' || *unit == 'M' ? value << 20 : *unit == 'g' || *unit == 'G' ? value << 30 : value;
}

/* (CUdeviceptr *or handle, size_t size, ...): the size is the second argument of all three. */
static CUresult metered(int idx, STANDIN_GENERIC_PARAMS) {
    bump(idx);
    unsigned long long size = (unsigned long long)(size_t)a1;
    if (__atomic_load_n(&g_used, __ATOMIC_RELAXED) + size > memory_limit())
        return CUDA_ERROR_OUT_OF_MEMORY;
    standin_generic_fn fn = (standin_generic_fn)real(idx);
    CUresult result = fn ? fn(STANDIN_GENERIC_ARGS) : CUDA_ERROR_STUB_LIBRARY;
    if (result == CUDA_SUCCESS)
        __atomic_fetch_add(&g_used, size, __ATOMIC_RELAXED);
    return result;
}

STANDIN_EXPORT CUresult cuMemAlloc_v2(STANDIN_GENERIC_PARAMS) {
    return metered(IDX_cuMemAlloc_v2, STANDIN_GENERIC_ARGS);
}

/* Its legacy hook is routed to the driver's current ABI (vgpu-manager's _cuMemAlloc). */
STANDIN_EXPORT CUresult cuMemAlloc(STANDIN_GENERIC_PARAMS) {
    bump(IDX_cuMemAlloc);
    return cuMemAlloc_v2(STANDIN_GENERIC_ARGS);
}

STANDIN_EXPORT CUresult cuMemAllocAsync(STANDIN_GENERIC_PARAMS) {
    return metered(IDX_cuMemAllocAsync, STANDIN_GENERIC_ARGS);
}

STANDIN_EXPORT CUresult cuMemCreate(STANDIN_GENERIC_PARAMS) {
    return metered(IDX_cuMemCreate, STANDIN_GENERIC_ARGS);
}

STANDIN_EXPORT CUresult cuMemGetInfo_v2(STANDIN_GENERIC_PARAMS) {
    bump(IDX_cuMemGetInfo_v2);
    standin_generic_fn fn = (standin_generic_fn)real(IDX_cuMemGetInfo_v2);
    CUresult result = fn ? fn(STANDIN_GENERIC_ARGS) : CUDA_ERROR_STUB_LIBRARY;
    unsigned long long limit = memory_limit();
    if (result == CUDA_SUCCESS && a0 && a1 && limit < *(unsigned long long *)a1) {
        *(unsigned long long *)a1 = limit;
        *(unsigned long long *)a0 = limit - __atomic_load_n(&g_used, __ATOMIC_RELAXED);
    }
    return result;
}

#define LAUNCH(n)                                                              \
    STANDIN_EXPORT CUresult n(STANDIN_GENERIC_PARAMS) {                        \
        bump(IDX_##n);                                                         \
        standin_generic_fn fn = (standin_generic_fn)real(IDX_##n);             \
        return fn ? fn(STANDIN_GENERIC_ARGS) : CUDA_ERROR_STUB_LIBRARY;        \
    }
LAUNCH(cuLaunchKernel)
LAUNCH(cuLaunchKernel_ptsz)
LAUNCH(cuLaunchKernelEx)
LAUNCH(cuGraphLaunch)

STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
STANDIN_EXPORT CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);

static void *const g_own[N_EPS] = {
#define X(n) (void *)n,
    VGPU_EPS(X)
#undef X
};

/* Pointer routing: which of its names the driver's pointer is, and its own export of that exact name. */
static void *route(void *from_driver) {
    for (int i = 0; from_driver && i < N_EPS; i++)
        if (real(i) == from_driver)
            return g_own[i];
    return from_driver;
}

STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                            unsigned long long flags, int *symbolStatus) {
    bump(IDX_cuGetProcAddress_v2);
    standin_gpa2_fn fn = (standin_gpa2_fn)real(IDX_cuGetProcAddress_v2);
    CUresult result = fn ? fn(symbol, pfn, cudaVersion, flags, symbolStatus) : CUDA_ERROR_STUB_LIBRARY;
    if (result == CUDA_SUCCESS && pfn)
        *pfn = route(*pfn);
    return result;
}

STANDIN_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                         unsigned long long flags) {
    bump(IDX_cuGetProcAddress);
    standin_gpa_fn fn = (standin_gpa_fn)real(IDX_cuGetProcAddress);
    CUresult result = fn ? fn(symbol, pfn, cudaVersion, flags) : CUDA_ERROR_STUB_LIBRARY;
    if (result == CUDA_SUCCESS && pfn)
        *pfn = route(*pfn);
    return result;
}

/* The process-wide look-up: any cu* name it exports, whatever the handle. */
STANDIN_EXPORT void *dlsym(void *handle, const char *symbol) {
    int i = strncmp(symbol, "cu", 2) == 0 ? index_of(symbol) : -1;
    return i >= 0 ? g_own[i] : real_dlsym()(handle, symbol);
}

STANDIN_EXPORT long long standin_vgpu_manager_calls(const char *name) {
    int i = index_of(name);
    return i < 0 ? -1 : __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
}
