/*
 * Stand-in for a GPU-sharing layer installed as the pod's libcuda.so.1.
 *
 * Default build: tkestack vCUDA as shipped (libcuda-control.so): exports L,
 * cuInit, cuDriverGetVersion, cuDeviceGetCount and a v1 cuGetProcAddress, each
 * metered and forwarded to the real driver found beside it; no tensor-map
 * encoders, no cuGetProcAddress_v2, no cuLaunchKernelEx.
 *   -DLAYER_FORK        a vCUDA fork that also exports the newer entry points.
 *   -DLAYER_NO_FORWARD  cuGetProcAddress answers 500 for names it lacks.
 *   -DLAYER_STANDALONE  lupine-like: no local driver, everything succeeds.
 *   -DLAYER_GPA_V2      exports cuGetProcAddress_v2 too (both look-ups forward what they do not hook),
 *                       still no encoders and no cuLaunchKernelEx.
 *   -DLAYER_NO_GPA      built against headers older than CUDA 11.3: no cuGetProcAddress of any version;
 *                       exports versioned and per-thread-stream symbols (cuMemAlloc and cuMemAlloc_v2,
 *                       cuMemcpyAsync_ptsz, ...) as an old driver does.
 * The real driver is found beside the layer, or in $STANDIN_LAYER_DRIVER_DIR when that is set.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin_entry_points.h"

#if defined(LAYER_FORK) + defined(LAYER_NO_FORWARD) + defined(LAYER_STANDALONE) +                    \
        defined(LAYER_GPA_V2) + defined(LAYER_NO_GPA) >                                                \
    1
#error "choose at most one layer variant"
#endif

#if defined(LAYER_FORK)
#define LAYER_VARIANT "fork"
#define LAYER_EXTRA_EPS(X) STANDIN_NEW_EPS(X)
#elif defined(LAYER_NO_FORWARD)
#define LAYER_VARIANT "noforward"
#define LAYER_EXTRA_EPS(X)
#elif defined(LAYER_STANDALONE)
#define LAYER_VARIANT "standalone"
#define LAYER_EXTRA_EPS(X)
#elif defined(LAYER_GPA_V2)
#define LAYER_VARIANT "gpa-v2"
#define LAYER_EXTRA_EPS(X) X(cuGetProcAddress_v2, -1, 0)
#elif defined(LAYER_NO_GPA)
#define LAYER_VARIANT "no-gpa"
/* Older ABIs and per-thread-default-stream variants, each its own (metered) function. */
#define LAYER_EXTRA_EPS(X)                                                     \
    X(cuMemAlloc, -1, 0)                                                       \
    X(cuCtxCreate, -1, 0)                                                      \
    X(cuCtxCreate_v3, -1, 0)                                                   \
    X(cuMemcpyAsync, -1, 0)                                                    \
    X(cuMemcpyAsync_ptsz, -1, 0)                                               \
    X(cuStreamBeginCapture, -1, 0)                                             \
    X(cuStreamBeginCapture_v2, -1, 0)                                          \
    X(cuStreamBeginCapture_v2_ptsz, -1, 0)                                     \
    X(cuLaunchKernel_ptsz, -1, 0)                                              \
    X(cuGraphInstantiate_v2, -1, 0)                                            \
    X(cuGraphInstantiateWithFlags, -1, 0)
#else
#define LAYER_VARIANT "upstream"
#define LAYER_EXTRA_EPS(X)
#endif

#if defined(LAYER_NO_GPA)
#define LAYER_GPA_EPS(X)
#else
#define LAYER_GPA_EPS(X) X(cuGetProcAddress, -1, 0)
#endif

#define LAYER_EPS(X)                                                           \
    STANDIN_L_EPS(X)                                                           \
    STANDIN_BASIC_EPS(X)                                                       \
    LAYER_EXTRA_EPS(X)                                                         \
    LAYER_GPA_EPS(X)

enum {
#define X(n, i, b) IDX_##n,
    LAYER_EPS(X)
#undef X
        N_EPS
};

static const char *const g_names[N_EPS] = {
#define X(n, i, b) #n,
    LAYER_EPS(X)
#undef X
};

static long long g_calls[N_EPS];
static char g_real_path[PATH_MAX];
#if !defined(LAYER_STANDALONE)
/* The real driver's functions, by the same index; filled by the constructor. */
static void *g_real[N_EPS];
#endif

static void bump(int idx) { __atomic_fetch_add(&g_calls[idx], 1, __ATOMIC_RELAXED); }

static int index_of(const char *name) {
    if (!name)
        return -1;
    for (int i = 0; i < N_EPS; i++)
        if (strcmp(g_names[i], name) == 0)
            return i;
    return -1;
}

#if !defined(LAYER_STANDALONE)
struct vcuda_config {
    char magic[16];
    int version;
    int utilization_limit;
    unsigned long long gpu_memory_limit;
    char pod_uid[48];
    char container_name[64];
};

STANDIN_EXPORT struct vcuda_config g_vcuda_config = {
    "vcuda-standin", 1, 50, 20ULL << 30, "standin-pod", "standin"};
#endif

STANDIN_EXPORT long long standin_layer_calls(const char *name) {
    int i = index_of(name);
    return i < 0 ? -1 : __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
}

STANDIN_EXPORT int standin_is_layer(void) { return 1; }

STANDIN_EXPORT const char *standin_layer_variant(void) { return LAYER_VARIANT; }

/* Path of the real driver the layer opened, or NULL. */
STANDIN_EXPORT const char *standin_layer_real_driver(void) {
    return g_real_path[0] ? g_real_path : NULL;
}

#if defined(LAYER_STANDALONE)

/* ---- lupine-like: count and succeed ------------------------------------- */

#define X(n, i, b)                                                             \
    STANDIN_EXPORT CUresult n(STANDIN_GENERIC_PARAMS) {                        \
        void *args[12] = {STANDIN_GENERIC_ARGS};                               \
        bump(IDX_##n);                                                         \
        if ((i) >= 0 && args[(i) < 0 ? 0 : (i)])                               \
            memset(args[(i) < 0 ? 0 : (i)], 0, (b));                           \
        return CUDA_SUCCESS;                                                   \
    }
STANDIN_GENERIC_EPS(X)
#undef X

STANDIN_EXPORT CUresult cuGetErrorString(STANDIN_GENERIC_PARAMS) {
    bump(IDX_cuGetErrorString);
    if (!a1)
        return CUDA_ERROR_INVALID_VALUE;
    *(const char **)a1 = "lupine stand-in error";
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuGetErrorName(STANDIN_GENERIC_PARAMS) {
    bump(IDX_cuGetErrorName);
    if (!a1)
        return CUDA_ERROR_INVALID_VALUE;
    *(const char **)a1 = "CUDA_ERROR_LUPINE_STANDIN";
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuInit(unsigned int flags) {
    (void)flags;
    bump(IDX_cuInit);
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuDriverGetVersion(int *version) {
    bump(IDX_cuDriverGetVersion);
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 12080;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuDeviceGetCount(int *count) {
    bump(IDX_cuDeviceGetCount);
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = 1;
    return CUDA_SUCCESS;
}

#else

/* ---- metered forwarding ------------------------------------------------- */

#define FORWARD_GENERIC(n)                                                     \
    STANDIN_EXPORT CUresult n(STANDIN_GENERIC_PARAMS) {                        \
        bump(IDX_##n);                                                         \
        standin_generic_fn f = (standin_generic_fn)g_real[IDX_##n];            \
        if (!f)                                                                \
            return CUDA_ERROR_STUB_LIBRARY;                                    \
        return f(STANDIN_GENERIC_ARGS);                                        \
    }
#define X(n, i, b) FORWARD_GENERIC(n)
STANDIN_L_EPS(X)
STANDIN_BASIC_EPS(X)
#undef X

#if defined(LAYER_FORK)
FORWARD_GENERIC(cuLaunchKernelEx)

#define FORWARD_EXACT(n, type, params, args)                                   \
    STANDIN_EXPORT CUresult n(params) {                                        \
        bump(IDX_##n);                                                         \
        type f = (type)g_real[IDX_##n];                                        \
        if (!f)                                                                \
            return CUDA_ERROR_STUB_LIBRARY;                                    \
        return f(args);                                                        \
    }
FORWARD_EXACT(cuTensorMapEncodeTiled, standin_tiled_fn, STANDIN_TILED_PARAMS,
              STANDIN_TILED_ARGS)
FORWARD_EXACT(cuTensorMapEncodeIm2col, standin_im2col_fn, STANDIN_IM2COL_PARAMS,
              STANDIN_IM2COL_ARGS)
FORWARD_EXACT(cuTensorMapEncodeIm2colWide, standin_im2col_wide_fn,
              STANDIN_IM2COL_WIDE_PARAMS, STANDIN_IM2COL_WIDE_ARGS)
FORWARD_EXACT(cuTensorMapReplaceAddress, standin_replace_fn,
              STANDIN_REPLACE_PARAMS, STANDIN_REPLACE_ARGS)
#endif /* LAYER_FORK */

#if defined(LAYER_NO_GPA)
#define X(n, i, b) FORWARD_GENERIC(n)
LAYER_EXTRA_EPS(X)
#undef X
#endif

#endif /* !LAYER_STANDALONE */

/* ---- cuGetProcAddress ---------------------------------------------------- */
#if !defined(LAYER_NO_GPA)

STANDIN_EXPORT CUresult cuGetProcAddress(const char *, void **, int,
                                         unsigned long long);
#if defined(LAYER_FORK) || defined(LAYER_GPA_V2)
STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int,
                                            unsigned long long, int *);
#endif

static const struct {
    const char *name;
    void *fn;
} g_own[N_EPS] = {
#define X(n, i, b) {#n, (void *)n},
    LAYER_EPS(X)
#undef X
};

static void *lookup_own_exact(const char *symbol) {
    for (int k = 0; k < N_EPS; k++)
        if (strcmp(g_own[k].name, symbol) == 0)
            return g_own[k].fn;
    return NULL;
}

/* A base name gives the layer's own current version ("cuMemAlloc" -> cuMemAlloc_v2), like the driver. */
static void *lookup_own(const char *symbol) {
    void *fn = lookup_own_exact(symbol);
    char versioned[128];
    if (!fn && snprintf(versioned, sizeof(versioned), "%s_v2", symbol) < (int)sizeof(versioned))
        fn = lookup_own_exact(versioned);
    return fn;
}

/* Own (metered) function for exported names; what happens to the rest is the variant's. */
STANDIN_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn,
                                         int cudaVersion,
                                         unsigned long long flags) {
    bump(IDX_cuGetProcAddress);
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    void *own = lookup_own(symbol);
    if (own) {
        *pfn = own;
        return CUDA_SUCCESS;
    }
    *pfn = NULL;
#if defined(LAYER_STANDALONE)
    (void)cudaVersion, (void)flags;
    return CUDA_SUCCESS;
#elif defined(LAYER_NO_FORWARD)
    (void)cudaVersion, (void)flags;
    return CUDA_ERROR_NOT_FOUND;
#else
    standin_gpa_fn real = (standin_gpa_fn)g_real[IDX_cuGetProcAddress];
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    return real(symbol, pfn, cudaVersion, flags);
#endif
}

#if defined(LAYER_FORK) || defined(LAYER_GPA_V2)
STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn,
                                            int cudaVersion,
                                            unsigned long long flags,
                                            int *symbolStatus) {
    bump(IDX_cuGetProcAddress_v2);
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    void *own = lookup_own(symbol);
    if (own) {
        *pfn = own;
        if (symbolStatus)
            *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    *pfn = NULL;
    standin_gpa2_fn real = (standin_gpa2_fn)g_real[IDX_cuGetProcAddress_v2];
    if (!real) {
        if (symbolStatus)
            *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    return real(symbol, pfn, cudaVersion, flags, symbolStatus);
}
#endif

#endif /* !LAYER_NO_GPA */

/* ---- finding the real driver, the way vCUDA does ------------------------ */

#if !defined(LAYER_STANDALONE)
/* libcuda.so.<digits>.<anything>, e.g. libcuda.so.550.142 (not libcuda.so.1). */
static int is_driver_file(const struct dirent *e) {
    static const char prefix[] = "libcuda.so.";
    const char *p = e->d_name;
    if (strncmp(p, prefix, sizeof(prefix) - 1) != 0)
        return 0;
    p += sizeof(prefix) - 1;
    if (*p < '0' || *p > '9')
        return 0;
    while (*p >= '0' && *p <= '9')
        p++;
    return *p == '.';
}

__attribute__((constructor)) static void layer_init(void) {
    Dl_info info;
    /* A hidden function's address, so interposition cannot point elsewhere. */
    if (!dladdr((void *)&layer_init, &info) || !info.dli_fname)
        return;
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", info.dli_fname);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof(dir), ".");
    const char *elsewhere = getenv("STANDIN_LAYER_DRIVER_DIR");
    if (elsewhere && *elsewhere)
        snprintf(dir, sizeof(dir), "%s", elsewhere);

    struct dirent **entries = NULL;
    int n = scandir(dir, &entries, is_driver_file, alphasort);
    if (n < 0)
        return;
    void *handle = NULL;
    for (int k = 0; k < n; k++) {
        if (!handle) {
            char path[PATH_MAX];
            int len = snprintf(path, sizeof(path), "%s/%s", dir,
                               entries[k]->d_name);
            void *h = NULL;
            if (len > 0 && (size_t)len < sizeof(path))
                h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (h && dlsym(h, "standin_is_layer")) {
                dlclose(h); /* another layer, not a driver */
            } else if (h) {
                handle = h;
                snprintf(g_real_path, sizeof(g_real_path), "%s", path);
            }
        }
        free(entries[k]);
    }
    free(entries);
    if (!handle)
        return;
    for (int k = 0; k < N_EPS; k++)
        g_real[k] = dlsym(handle, g_names[k]);
}
#endif
