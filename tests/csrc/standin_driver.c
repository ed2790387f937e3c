/*
 * Stand-in for NVIDIA's real driver library (libcuda.so.<version>, SONAME
 * libcuda.so.1). Every entry point counts its calls and succeeds; the
 * tensor-map encoders write a recognisable descriptor (see write_descriptor).
 * Like the real driver it also exports the older ABIs: the legacy cuMemAlloc,
 * cuMemGetInfo and cuDeviceTotalMem (32-bit sizes and pointers) answer
 * CUDA_ERROR_INVALID_CONTEXT, the failure a 64-bit caller handed them saw on
 * an H200 under tkestack vCUDA (docs/design.md §2.2).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "standin_entry_points.h"

#define DRIVER_EPS(X)                                                          \
    STANDIN_L_EPS(X)                                                           \
    STANDIN_BASIC_EPS(X)                                                       \
    STANDIN_LEGACY_EPS(X)                                                      \
    STANDIN_CUDA12_EPS(X)                                                      \
    STANDIN_NEW_EPS(X)                                                         \
    X(cuOccupancyMaxActiveClusters, -1, 0)                                     \
    X(cuGetProcAddress, -1, 0)

/* What a process would see as the whole GPU's memory. */
#define DEVICE_MEMORY (80ULL << 30)

enum {
#define X(n, i, b) IDX_##n,
    DRIVER_EPS(X)
#undef X
        N_EPS
};

static const char *const g_names[N_EPS] = {
#define X(n, i, b) #n,
    DRIVER_EPS(X)
#undef X
};

static long long g_calls[N_EPS];
static unsigned long long g_encoder_calls;

static void bump(int idx) { __atomic_fetch_add(&g_calls[idx], 1, __ATOMIC_RELAXED); }

static int index_of(const char *name) {
    if (!name)
        return -1;
    for (int i = 0; i < N_EPS; i++)
        if (strcmp(g_names[i], name) == 0)
            return i;
    return -1;
}

STANDIN_EXPORT long long standin_driver_calls(const char *name) {
    int i = index_of(name);
    return i < 0 ? -1 : __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
}

STANDIN_EXPORT unsigned long long standin_encoder_calls(void) {
    return __atomic_load_n(&g_encoder_calls, __ATOMIC_RELAXED);
}

STANDIN_EXPORT int standin_is_real_driver(void) { return 1; }

/* Generic entry points: count, zero the obvious out-pointer, succeed. */
#define X(n, i, b)                                                             \
    STANDIN_EXPORT CUresult n(STANDIN_GENERIC_PARAMS) {                        \
        void *args[12] = {STANDIN_GENERIC_ARGS};                               \
        bump(IDX_##n);                                                         \
        if ((i) >= 0 && args[(i) < 0 ? 0 : (i)])                               \
            memset(args[(i) < 0 ? 0 : (i)], 0, (b));                           \
        return CUDA_SUCCESS;                                                   \
    }
STANDIN_GENERIC_EPS(X)
STANDIN_CUDA12_EPS(X)
X(cuMemAlloc_v2, 0, 8)
X(cuLaunchKernel, -1, 0)
X(cuLaunchCooperativeKernel, -1, 0)
X(cuLaunchKernel_ptsz, -1, 0)
X(cuLaunchCooperativeKernel_ptsz, -1, 0)
X(cuMemcpyAsync, -1, 0)
X(cuMemcpyAsync_ptsz, -1, 0)
X(cuStreamWaitValue32, -1, 0)
X(cuLaunchKernelEx, -1, 0)
X(cuLaunchKernelEx_ptsz, -1, 0)
#undef X

/* (size_t *free, size_t *total) */
STANDIN_EXPORT CUresult cuMemGetInfo_v2(STANDIN_GENERIC_PARAMS) {
    bump(IDX_cuMemGetInfo_v2);
    if (!a0 || !a1)
        return CUDA_ERROR_INVALID_VALUE;
    *(unsigned long long *)a0 = *(unsigned long long *)a1 = DEVICE_MEMORY;
    return CUDA_SUCCESS;
}

/* (size_t *bytes, CUdevice) */
STANDIN_EXPORT CUresult cuDeviceTotalMem_v2(STANDIN_GENERIC_PARAMS) {
    bump(IDX_cuDeviceTotalMem_v2);
    if (!a0)
        return CUDA_ERROR_INVALID_VALUE;
    *(unsigned long long *)a0 = DEVICE_MEMORY;
    return CUDA_SUCCESS;
}

/* The pre-3.2 ABIs: counted, and unusable by a caller built for the current ones. */
#define LEGACY(n)                                                              \
    STANDIN_EXPORT CUresult n(STANDIN_GENERIC_PARAMS) {                        \
        (void)a0;                                                              \
        bump(IDX_##n);                                                         \
        return CUDA_ERROR_INVALID_CONTEXT;                                     \
    }
/* (const void **table, const CUuuid *id): the runtime's private tables, which a stand-in does not have. */
STANDIN_EXPORT CUresult cuGetExportTable(STANDIN_GENERIC_PARAMS) {
    (void)a1;
    bump(IDX_cuGetExportTable);
    if (a0)
        *(void **)a0 = NULL;
    return CUDA_ERROR_NOT_FOUND;
}

LEGACY(cuMemAlloc)
LEGACY(cuMemGetInfo)
LEGACY(cuDeviceTotalMem)

/* (int *numClusters, CUfunction, const CUlaunchConfig *): Triton's launcher looks it up (CUDA 11.8+). */
STANDIN_EXPORT CUresult cuOccupancyMaxActiveClusters(STANDIN_GENERIC_PARAMS) {
    bump(IDX_cuOccupancyMaxActiveClusters);
    if (a0)
        *(int *)a0 = 1;
    return CUDA_SUCCESS;
}

struct err_entry {
    int code;
    const char *name;
    const char *text;
};

static const struct err_entry g_errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const struct err_entry *find_error(int code) {
    for (size_t k = 0; k < sizeof(g_errors) / sizeof(g_errors[0]); k++)
        if (g_errors[k].code == code)
            return &g_errors[k];
    return &g_errors[sizeof(g_errors) / sizeof(g_errors[0]) - 1];
}

/* (CUresult error, const char **pStr): always hands back a static string. */
STANDIN_EXPORT CUresult cuGetErrorString(STANDIN_GENERIC_PARAMS) {
    bump(IDX_cuGetErrorString);
    if (!a1)
        return CUDA_ERROR_INVALID_VALUE;
    *(const char **)a1 = find_error((int)(intptr_t)a0)->text;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuGetErrorName(STANDIN_GENERIC_PARAMS) {
    bump(IDX_cuGetErrorName);
    if (!a1)
        return CUDA_ERROR_INVALID_VALUE;
    *(const char **)a1 = find_error((int)(intptr_t)a0)->name;
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
    *version = 13000;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuDeviceGetCount(int *count) {
    bump(IDX_cuDeviceGetCount);
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = 1;
    return CUDA_SUCCESS;
}

/* ---- tensor-map encoders ---------------------------------------------- */

static void put32(unsigned char *p, uint32_t v) {
    for (int k = 0; k < 4; k++)
        p[k] = (unsigned char)(v >> (8 * k));
}

static void put64(unsigned char *p, uint64_t v) {
    for (int k = 0; k < 8; k++)
        p[k] = (unsigned char)(v >> (8 * k));
}

/* Every encoder call (failing ones and ReplaceAddress included) takes a number. */
static uint64_t next_call_number(void) {
    return __atomic_add_fetch(&g_encoder_calls, 1, __ATOMIC_RELAXED);
}

/*
 * 128-byte descriptor: "TMAGUARD-STANDIN", u32 dataType, u32 rank,
 * u64 globalAddress, u64 globalDim[0], u64 call number (all little-endian),
 * then byte i = (i * 7 + 3) & 0xff up to 127.
 */
static void write_descriptor(void *tensorMap, int dataType, cuuint32_t rank,
                             void *globalAddress, const cuuint64_t *globalDim,
                             uint64_t call_number) {
    unsigned char *d = tensorMap;
    for (int k = 0; k < 128; k++)
        d[k] = (unsigned char)((k * 7 + 3) & 0xff);
    memcpy(d, "TMAGUARD-STANDIN", 16);
    put32(d + 16, (uint32_t)dataType);
    put32(d + 20, rank);
    put64(d + 24, (uint64_t)(uintptr_t)globalAddress);
    put64(d + 32, (rank != 0 && globalDim) ? globalDim[0] : 0);
    put64(d + 40, call_number);
}

STANDIN_EXPORT CUresult cuTensorMapEncodeTiled(STANDIN_TILED_PARAMS) {
    (void)globalStrides, (void)boxDim, (void)elementStrides, (void)interleave;
    (void)swizzle, (void)l2Promotion, (void)oobFill;
    bump(IDX_cuTensorMapEncodeTiled);
    uint64_t n = next_call_number();
    if (!tensorMap)
        return CUDA_ERROR_INVALID_VALUE;
    write_descriptor(tensorMap, dataType, rank, globalAddress, globalDim, n);
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuTensorMapEncodeIm2col(STANDIN_IM2COL_PARAMS) {
    (void)globalStrides, (void)pixelBoxLowerCorner, (void)pixelBoxUpperCorner;
    (void)channelsPerPixel, (void)pixelsPerColumn, (void)elementStrides;
    (void)interleave, (void)swizzle, (void)l2Promotion, (void)oobFill;
    bump(IDX_cuTensorMapEncodeIm2col);
    uint64_t n = next_call_number();
    if (!tensorMap)
        return CUDA_ERROR_INVALID_VALUE;
    write_descriptor(tensorMap, dataType, rank, globalAddress, globalDim, n);
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuTensorMapEncodeIm2colWide(STANDIN_IM2COL_WIDE_PARAMS) {
    (void)globalStrides, (void)pixelBoxLowerCornerWidth;
    (void)pixelBoxUpperCornerWidth, (void)channelsPerPixel;
    (void)pixelsPerColumn, (void)elementStrides, (void)interleave, (void)mode;
    (void)swizzle, (void)l2Promotion, (void)oobFill;
    bump(IDX_cuTensorMapEncodeIm2colWide);
    uint64_t n = next_call_number();
    if (!tensorMap)
        return CUDA_ERROR_INVALID_VALUE;
    write_descriptor(tensorMap, dataType, rank, globalAddress, globalDim, n);
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuTensorMapReplaceAddress(STANDIN_REPLACE_PARAMS) {
    bump(IDX_cuTensorMapReplaceAddress);
    next_call_number();
    if (!tensorMap)
        return CUDA_ERROR_INVALID_VALUE;
    put64((unsigned char *)tensorMap + 24, (uint64_t)(uintptr_t)globalAddress);
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ---------------------------------------------------- */

STANDIN_EXPORT CUresult cuGetProcAddress(const char *, void **, int,
                                         unsigned long long);
STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int,
                                            unsigned long long, int *);

static const struct {
    const char *name;
    void *fn;
} g_table[N_EPS] = {
#define X(n, i, b) {#n, (void *)n},
    DRIVER_EPS(X)
#undef X
};

static void *lookup_exact(const char *symbol) {
    for (int k = 0; k < N_EPS; k++)
        if (strcmp(g_table[k].name, symbol) == 0)
            return g_table[k].fn;
    return NULL;
}

/* Like the real driver, a base name gives its current ABI ("cuMemAlloc" -> cuMemAlloc_v2, and for a
 * per-thread-default-stream caller "cuLaunchKernel" -> cuLaunchKernel_ptsz). The stand-in takes the newest
 * symbol it has, whatever the version asked. */
static void *lookup(const char *symbol, unsigned long long flags) {
    static const char *const suffixes[] = {"_v4", "_v3", "_v2", ""};
    char versioned[128];
    for (size_t k = 0; k < sizeof(suffixes) / sizeof(suffixes[0]); k++) {
        const char *ptsz = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM ? "_ptsz" : "";
        for (int per_thread = 1; per_thread >= 0; per_thread--) {
            snprintf(versioned, sizeof(versioned), "%s%s%s", symbol, suffixes[k], per_thread ? ptsz : "");
            void *fn = (per_thread && !*ptsz) ? NULL : lookup_exact(versioned);
            if (fn)
                return fn;
        }
    }
    return NULL;
}

/* Like the real driver: unknown names give CUDA_SUCCESS and a NULL pointer. */
STANDIN_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn,
                                         int cudaVersion,
                                         unsigned long long flags) {
    (void)cudaVersion;
    bump(IDX_cuGetProcAddress);
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = lookup(symbol, flags);
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn,
                                            int cudaVersion,
                                            unsigned long long flags,
                                            int *symbolStatus) {
    (void)cudaVersion;
    bump(IDX_cuGetProcAddress_v2);
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = lookup(symbol, flags);
    if (symbolStatus)
        *symbolStatus = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS
                             : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS;
}
