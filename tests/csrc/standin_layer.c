/*
 * Stand-in for a GPU-sharing layer installed as the pod's libcuda.so.1, modelled on tkestack vCUDA's
 * vcuda-controller as built from its source (docs/real-layers.md names the commits):
 *
 * - Built against CUDA 11 headers: exports L, the older ABIs beside it (cuMemAlloc and cuMemAlloc_v2, ...),
 *   a v1 cuGetProcAddress; no tensor-map encoders, no cuGetProcAddress_v2, no cuLaunchKernelEx, nothing of
 *   CUDA 12 (cuLibrary*, cuKernel*).
 * - Every export forwards through a table that only the layer's init fills: cuInit, cuDriverGetVersion,
 *   nvmlInit_v2/nvmlInitWithFlags (NVML is the layer too: libnvidia-ml.so.1 is the same file) and, in
 *   master, cuGetProcAddress. A call through the empty table is a crash in the real layer; here it aborts
 *   with a line naming the entry point.
 * - The init reads $STANDIN_VCUDA_ROOT/etc/vcuda/vcuda.config (vCUDA's resource_data_t, 8240 bytes: the
 *   quota in bytes at 8208, `enable` at 8232; without the file the real layer exits the process with -1,
 *   and so does this one; `enable` 0 is no limit), registers the process with the node's
 *   daemon (a line in $STANDIN_VCUDA_ROOT/etc/vcuda/registrations stands for gpu-client), reads the driver
 *   version from $STANDIN_VCUDA_ROOT/proc/driver/nvidia/version and opens libcuda.so.<version> and
 *   libnvidia-ml.so.<version> by those names.
 * - Meters: cuMemAlloc_v2 and legacy cuMemAlloc against the quota; cuMemGetInfo(_v2) and
 *   cuDeviceTotalMem(_v2) answer with the quota; launches are counted.
 * Variants:
 *   default             vCUDA master: its v1 cuGetProcAddress runs the init, asks the real driver, then swaps
 *                       in its hook by the requested name, so ("cuMemAlloc", 13000) gets the legacy hook.
 *   -DLAYER_VCUDA_V105  vCUDA v1.0.5: its v1 cuGetProcAddress forwards through the table, hook-less (the
 *                       real driver's pointers: unmetered), and through the empty table before init.
 *   -DLAYER_FORK        the CUDA 12 fork (coldzerofear/vcuda-controller ec4dee1): also exports
 *                       cuGetProcAddress_v2, cuLaunchKernelEx(_ptsz) and three of the four encoders (not
 *                       cuTensorMapEncodeIm2colWide, newer than its CUDA 12.2 headers), g_vcuda_config and
 *                       its own helper search_on_pids_table. Its cuGetProcAddress_v2 runs the init, asks the
 *                       real driver (which writes the pointer and the status), then swaps in its hook by the
 *                       requested base name as master's v1 does: ("cuMemAlloc", 13000) gets the legacy hook,
 *                       which calls the driver's pre-3.2 cuMemAlloc (CUDA_ERROR_INVALID_CONTEXT), and
 *                       ("cuGetProcAddress", 12000) its 4-argument v1 hook, which never writes a 5-argument
 *                       caller's status.
 *   -DLAYER_STANDALONE  lupine-like: no local driver, everything succeeds.
 *   -DLAYER_STANDALONE -DLAYER_LUPINE_CLIENT  lupine's client libcuda.so.1 (lupinemachines/lupine 7fbd364):
 *                       also exports cuTensorMapEncodeTiled (forwarded to its server: one round trip per
 *                       encode, counted; the descriptor the stand-in driver would write), cuGetProcAddress_v2
 *                       (a name it does not know gets a stub answering CUDA_ERROR_NOT_SUPPORTED, reported as
 *                       found), cuLaunchKernelEx (a launch with attributes is a round trip), dlsym and its
 *                       checkpoint calls (lupine_checkpoint_*); not the other three encoders. A launch with
 *                       `extra` parameters answers CUDA_ERROR_NOT_SUPPORTED.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "standin_entry_points.h"

#define CUDA_ERROR_NOT_SUPPORTED 801

#if defined(LAYER_FORK) + defined(LAYER_STANDALONE) + defined(LAYER_VCUDA_V105) > 1
#error "choose at most one layer variant"
#endif

#if defined(LAYER_FORK)
#define LAYER_VARIANT "fork"
#define LAYER_EXTRA_EPS(X)                                                     \
    X(cuTensorMapEncodeTiled, -1, 0)                                           \
    X(cuTensorMapEncodeIm2col, -1, 0)                                          \
    X(cuTensorMapReplaceAddress, -1, 0)                                        \
    X(cuGetProcAddress_v2, -1, 0)                                              \
    X(cuLaunchKernelEx, -1, 0)                                                 \
    X(cuLaunchKernelEx_ptsz, -1, 0)
#elif defined(LAYER_STANDALONE) && defined(LAYER_LUPINE_CLIENT)
#define LAYER_VARIANT "lupine-client"
#define LAYER_EXTRA_EPS(X)                                                     \
    X(cuTensorMapEncodeTiled, -1, 0)                                           \
    X(cuGetProcAddress_v2, -1, 0)                                              \
    X(cuLaunchKernelEx, -1, 0)
#elif defined(LAYER_STANDALONE)
#define LAYER_VARIANT "standalone"
#define LAYER_EXTRA_EPS(X)
#elif defined(LAYER_VCUDA_V105)
#define LAYER_VARIANT "vcuda-v1.0.5"
#define LAYER_EXTRA_EPS(X)
#else
#define LAYER_VARIANT "vcuda-master"
#define LAYER_EXTRA_EPS(X)
#endif

#define LAYER_EPS(X)                                                           \
    STANDIN_L_EPS(X)                                                           \
    STANDIN_BASIC_EPS(X)                                                       \
    LAYER_EXTRA_EPS(X)                                                         \
    X(cuGetProcAddress, -1, 0)

/* vCUDA's own: CUDA 11 ABIs beside L (not in the standalone layer, which is not vCUDA). */
#if defined(LAYER_STANDALONE)
#define LAYER_ALL_EPS(X) LAYER_EPS(X)
#else
#define LAYER_ALL_EPS(X) LAYER_EPS(X) STANDIN_LEGACY_EPS(X)
#endif

enum {
#define X(n, i, b) IDX_##n,
    LAYER_ALL_EPS(X)
#undef X
        N_EPS
};

static const char *const g_names[N_EPS] = {
#define X(n, i, b) #n,
    LAYER_ALL_EPS(X)
#undef X
};

static long long g_calls[N_EPS];

static void bump(int idx) { __atomic_fetch_add(&g_calls[idx], 1, __ATOMIC_RELAXED); }

static int index_of(const char *name) {
    if (!name)
        return -1;
    for (int i = 0; i < N_EPS; i++)
        if (strcmp(g_names[i], name) == 0)
            return i;
    return -1;
}

STANDIN_EXPORT long long standin_layer_calls(const char *name) {
    int i = index_of(name);
    return i < 0 ? -1 : __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
}

STANDIN_EXPORT int standin_is_layer(void) { return 1; }

STANDIN_EXPORT const char *standin_layer_variant(void) { return LAYER_VARIANT; }

#if defined(LAYER_STANDALONE)

/* ---- lupine-like: count and succeed ------------------------------------- */

STANDIN_EXPORT const char *standin_layer_real_driver(void) { return NULL; }

#if defined(LAYER_LUPINE_CLIENT)
#define REFUSES_EXTRA(n, args) ((IDX_##n) == IDX_cuLaunchKernel && (args)[10] != NULL)
#else
#define REFUSES_EXTRA(n, args) 0
#endif
#define X(n, i, b)                                                             \
    STANDIN_EXPORT CUresult n(STANDIN_GENERIC_PARAMS) {                        \
        void *args[12] = {STANDIN_GENERIC_ARGS};                               \
        bump(IDX_##n);                                                         \
        if (REFUSES_EXTRA(n, args))                                            \
            return CUDA_ERROR_NOT_SUPPORTED;                                   \
        if ((i) >= 0 && args[(i) < 0 ? 0 : (i)])                               \
            memset(args[(i) < 0 ? 0 : (i)], 0, (b));                           \
        return CUDA_SUCCESS;                                                   \
    }
STANDIN_GENERIC_EPS(X)
STANDIN_METERED_EPS(X)
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

/* Unknown names: CUDA_SUCCESS and a NULL pointer, like a layer that stubs what it does not know. */
STANDIN_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                         unsigned long long flags) {
    (void)cudaVersion, (void)flags;
    bump(IDX_cuGetProcAddress);
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = index_of(symbol) < 0 ? NULL : dlsym(RTLD_DEFAULT, symbol);
    return CUDA_SUCCESS;
}

#if defined(LAYER_LUPINE_CLIENT)
/* ---- lupine's client: the tiled encoder and launches with attributes go to its server -------------- */

static long long g_round_trips;

STANDIN_EXPORT long long standin_lupine_round_trips(void) {
    return __atomic_load_n(&g_round_trips, __ATOMIC_RELAXED);
}

/* The server runs the real encoder on the device address: the stand-in driver's descriptor format. */
STANDIN_EXPORT CUresult cuTensorMapEncodeTiled(STANDIN_TILED_PARAMS) {
    (void)globalStrides, (void)boxDim, (void)elementStrides, (void)interleave;
    (void)swizzle, (void)l2Promotion, (void)oobFill;
    bump(IDX_cuTensorMapEncodeTiled);
    unsigned long long call = (unsigned long long)__atomic_add_fetch(&g_round_trips, 1, __ATOMIC_RELAXED);
    if (!tensorMap)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char *d = tensorMap;
    for (int k = 0; k < 128; k++)
        d[k] = (unsigned char)((k * 7 + 3) & 0xff);
    memcpy(d, "TMAGUARD-STANDIN", 16);
    unsigned long long fields[4] = {(unsigned long long)(uintptr_t)globalAddress,
                                    rank && globalDim ? globalDim[0] : 0, call, 0};
    unsigned int head[2] = {(unsigned int)dataType, rank};
    memcpy(d + 16, head, sizeof head); /* little-endian, as the stand-in driver writes them */
    memcpy(d + 24, fields, 3 * sizeof fields[0]);
    return CUDA_SUCCESS;
}

/* (const CUlaunchConfig *config, CUfunction, void **params, void **extra) */
STANDIN_EXPORT CUresult cuLaunchKernelEx(STANDIN_GENERIC_PARAMS) {
    bump(IDX_cuLaunchKernelEx);
    if (a3)
        return CUDA_ERROR_NOT_SUPPORTED;
    const unsigned *config = a0;
    if (config && config[12]) /* numAttrs (after grid, block, shared, stream, attrs) */
        __atomic_fetch_add(&g_round_trips, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

static CUresult missing_stub(void) { return CUDA_ERROR_NOT_SUPPORTED; }

STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
STANDIN_EXPORT CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);

static void *const g_own[N_EPS] = {
#define X(n, i, b) (void *)n,
    LAYER_ALL_EPS(X)
#undef X
};

/* Its own functions by name; a cu* name it does not know: a stub answering NOT_SUPPORTED, as found. */
STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                            unsigned long long flags, int *symbolStatus) {
    (void)cudaVersion, (void)flags;
    bump(IDX_cuGetProcAddress_v2);
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    int i = index_of(symbol);
    *pfn = i >= 0 ? g_own[i] : (void *)missing_stub;
    if (symbolStatus)
        *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

/* Its dlsym, for whoever binds to it: its own cu* functions (stubs for the rest), the real dlsym otherwise. */
STANDIN_EXPORT void *dlsym(void *handle, const char *symbol) {
    if (strncmp(symbol, "cu", 2) == 0 && symbol[2] >= 'A' && symbol[2] <= 'Z') {
        int i = index_of(symbol);
        return i >= 0 ? g_own[i] : (void *)missing_stub;
    }
    typedef void *(*dlsym_fn)(void *, const char *);
    dlsym_fn real = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return real ? real(handle, symbol) : NULL;
}

STANDIN_EXPORT void lupine_checkpoint_drain_cuda_calls(void) {}
STANDIN_EXPORT void lupine_checkpoint_resume_cuda_calls(void) {}
#endif

#else /* a vCUDA build */

/* ---- the table its init fills ------------------------------------------- */

static void *g_real[N_EPS];
static char g_real_path[PATH_MAX];
static unsigned long long g_quota;
static unsigned long long g_used;
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;

STANDIN_EXPORT const char *standin_layer_real_driver(void) {
    return g_real_path[0] ? g_real_path : NULL;
}

/* The layer's own accounting of this process's device memory. */
STANDIN_EXPORT unsigned long long standin_layer_used_bytes(void) {
    return __atomic_load_n(&g_used, __ATOMIC_RELAXED);
}

static void *table_entry(int idx) {
    void *fn = __atomic_load_n(&g_real[idx], __ATOMIC_ACQUIRE);
    if (!fn) {
        fprintf(stderr, "standin vCUDA: %s called through the empty table (the layer's init has not run)\n",
                g_names[idx]);
        abort();
    }
    return fn;
}

static void path_under_root(char *out, size_t size, const char *path) {
    const char *root = getenv("STANDIN_VCUDA_ROOT");
    snprintf(out, size, "%s%s", root ? root : "", path);
}

static void read_driver_version(char *version, size_t size) {
    char path[PATH_MAX], line[512];
    path_under_root(path, sizeof path, "/proc/driver/nvidia/version");
    FILE *file = fopen(path, "r");
    version[0] = '\0';
    while (file && fgets(line, sizeof line, file)) {
        if (strncmp(line, "NVRM", 4) != 0)
            continue;
        /* the first token of the form digits.digits[...] */
        for (char *p = line; *p; p++) {
            if (*p >= '0' && *p <= '9' && (p == line || p[-1] == ' ')) {
                size_t n = strspn(p, "0123456789.");
                if (memchr(p, '.', n) && n < size) {
                    memcpy(version, p, n);
                    version[n] = '\0';
                    break;
                }
            }
        }
        break;
    }
    if (file)
        fclose(file);
}

static void register_with_daemon(void) {
    char path[PATH_MAX];
    path_under_root(path, sizeof path, "/etc/vcuda/registrations");
    FILE *file = fopen(path, "a");
    if (file) {
        fprintf(file, "pid %d\n", (int)getpid());
        fclose(file);
    }
}

/* NVML: the same file answers libnvidia-ml.so.1 in a vCUDA pod. */
#define LAYER_NVML(X)                                                          \
    X(nvmlInit)                                                                \
    X(nvmlInit_v2)                                                             \
    X(nvmlInitWithFlags)                                                       \
    X(nvmlShutdown)                                                            \
    X(nvmlErrorString)                                                         \
    X(nvmlDeviceGetCount)                                                      \
    X(nvmlDeviceGetCount_v2)                                                   \
    X(nvmlDeviceGetHandleByIndex)                                              \
    X(nvmlDeviceGetHandleByIndex_v2)                                           \
    X(nvmlDeviceGetHandleByPciBusId_v2)                                        \
    X(nvmlDeviceGetHandleByUUID)                                               \
    X(nvmlDeviceGetName)                                                       \
    X(nvmlDeviceGetCudaComputeCapability)                                      \
    X(nvmlDeviceGetMemoryInfo)                                                 \
    X(nvmlDeviceGetMemoryInfo_v2)                                              \
    X(nvmlDeviceGetMigMode)                                                    \
    X(nvmlDeviceGetVirtualizationMode)                                         \
    X(nvmlDeviceGetUUID)                                                       \
    X(nvmlDeviceGetIndex)                                                      \
    X(nvmlDeviceGetMinorNumber)                                                \
    X(nvmlDeviceGetPciInfo)                                                    \
    X(nvmlDeviceGetPciInfo_v3)                                                 \
    X(nvmlDeviceGetP2PStatus)                                                  \
    X(nvmlDeviceGetNvLinkState)                                                \
    X(nvmlDeviceGetTopologyCommonAncestor)                                     \
    X(nvmlDeviceGetCpuAffinity)                                                \
    X(nvmlDeviceGetNumaNodeId)                                                 \
    X(nvmlDeviceGetArchitecture)                                               \
    X(nvmlDeviceGetBrand)                                                      \
    X(nvmlDeviceGetComputeRunningProcesses)                                    \
    X(nvmlDeviceGetComputeRunningProcesses_v3)                                 \
    X(nvmlDeviceIsMigDeviceHandle)                                             \
    X(nvmlDeviceGetMaxMigDeviceCount)                                          \
    X(nvmlSystemGetDriverVersion)                                              \
    X(nvmlSystemGetCudaDriverVersion)                                          \
    X(nvmlSystemGetCudaDriverVersion_v2)                                       \
    X(nvmlSystemGetNVMLVersion)

enum {
#define N(n) NVML_##n,
    LAYER_NVML(N)
#undef N
        N_NVML
};
static const char *const g_nvml_names[N_NVML] = {
#define N(n) #n,
    LAYER_NVML(N)
#undef N
};
static void *g_nvml[N_NVML];

static void layer_init(void) {
    char config[PATH_MAX];
    path_under_root(config, sizeof config, "/etc/vcuda/vcuda.config");
    unsigned char data[8240];
    FILE *file = fopen(config, "rb");
    if (!file || fread(data, 1, sizeof data, file) != sizeof data) {
        fprintf(stderr, "standin vCUDA: can't get config file path\n");
        exit(-1);
    }
    fclose(file);
    int enable;
    memcpy(&g_quota, data + 8208, sizeof g_quota);
    memcpy(&enable, data + 8232, sizeof enable);
    if (!enable)
        g_quota = ~0ULL >> 1;
    register_with_daemon();

    char version[64], name[128];
    read_driver_version(version, sizeof version);
    snprintf(name, sizeof name, "libcuda.so.%s", version);
    void *driver = dlopen(name, RTLD_NOW | RTLD_NODELETE);
    if (!driver) {
        fprintf(stderr, "standin vCUDA: can't find library %s\n", name);
        exit(-1);
    }
    Dl_info info;
    if (dladdr(dlsym(driver, "cuInit"), &info) && info.dli_fname)
        snprintf(g_real_path, sizeof g_real_path, "%s", info.dli_fname);
    for (int k = 0; k < N_EPS; k++)
        __atomic_store_n(&g_real[k], dlsym(driver, g_names[k]), __ATOMIC_RELEASE);

    snprintf(name, sizeof name, "libnvidia-ml.so.%s", version);
    void *nvml = dlopen(name, RTLD_NOW | RTLD_NODELETE);
    for (int k = 0; nvml && k < N_NVML; k++)
        g_nvml[k] = dlsym(nvml, g_nvml_names[k]);
    if (g_nvml[NVML_nvmlInit_v2])
        ((int (*)(void))g_nvml[NVML_nvmlInit_v2])();
    ((CUresult(*)(unsigned))table_entry(IDX_cuInit))(0);
}

static void init_once(void) { pthread_once(&g_init_once, layer_init); }

/* ---- plain forwarders ----------------------------------------------------- */

#define FORWARD_GENERIC(n)                                                     \
    STANDIN_EXPORT CUresult n(STANDIN_GENERIC_PARAMS) {                        \
        bump(IDX_##n);                                                         \
        return ((standin_generic_fn)table_entry(IDX_##n))(STANDIN_GENERIC_ARGS); \
    }
#define X(n, i, b) FORWARD_GENERIC(n)
STANDIN_GENERIC_EPS(X)
STANDIN_ERROR_EPS(X)
#undef X
FORWARD_GENERIC(cuMemcpyAsync)
FORWARD_GENERIC(cuMemcpyAsync_ptsz)
FORWARD_GENERIC(cuStreamWaitValue32)
FORWARD_GENERIC(cuGetExportTable)
FORWARD_GENERIC(cuDeviceGetCount)

/* NVML: the init entry points run the layer's init; the rest forward through its table. */
#define NVML_FORWARD(n)                                                        \
    STANDIN_EXPORT int n(STANDIN_GENERIC_PARAMS) {                             \
        if (!g_nvml[NVML_##n]) {                                               \
            fprintf(stderr, "standin vCUDA: %s called before the layer's init\n", #n); \
            abort();                                                           \
        }                                                                      \
        return ((standin_generic_fn)g_nvml[NVML_##n])(STANDIN_GENERIC_ARGS);   \
    }
#define NVML_INIT(n)                                                           \
    STANDIN_EXPORT int n(STANDIN_GENERIC_PARAMS) {                             \
        init_once();                                                           \
        return g_nvml[NVML_##n] ? ((standin_generic_fn)g_nvml[NVML_##n])(STANDIN_GENERIC_ARGS) : 9; \
    }
NVML_INIT(nvmlInit_v2)
NVML_INIT(nvmlInitWithFlags)
NVML_FORWARD(nvmlInit)
NVML_FORWARD(nvmlShutdown)
NVML_FORWARD(nvmlDeviceGetCount)
NVML_FORWARD(nvmlDeviceGetCount_v2)
NVML_FORWARD(nvmlDeviceGetHandleByIndex)
NVML_FORWARD(nvmlDeviceGetHandleByIndex_v2)
NVML_FORWARD(nvmlDeviceGetHandleByPciBusId_v2)
NVML_FORWARD(nvmlDeviceGetHandleByUUID)
NVML_FORWARD(nvmlDeviceGetName)
NVML_FORWARD(nvmlDeviceGetCudaComputeCapability)
NVML_FORWARD(nvmlDeviceGetMemoryInfo)
NVML_FORWARD(nvmlDeviceGetMemoryInfo_v2)
NVML_FORWARD(nvmlDeviceGetMigMode)
NVML_FORWARD(nvmlDeviceGetVirtualizationMode)
NVML_FORWARD(nvmlDeviceGetUUID)
NVML_FORWARD(nvmlDeviceGetIndex)
NVML_FORWARD(nvmlDeviceGetMinorNumber)
NVML_FORWARD(nvmlDeviceGetPciInfo)
NVML_FORWARD(nvmlDeviceGetPciInfo_v3)
NVML_FORWARD(nvmlDeviceGetP2PStatus)
NVML_FORWARD(nvmlDeviceGetNvLinkState)
NVML_FORWARD(nvmlDeviceGetTopologyCommonAncestor)
NVML_FORWARD(nvmlDeviceGetCpuAffinity)
NVML_FORWARD(nvmlDeviceGetNumaNodeId)
NVML_FORWARD(nvmlDeviceGetArchitecture)
NVML_FORWARD(nvmlDeviceGetBrand)
NVML_FORWARD(nvmlDeviceGetComputeRunningProcesses)
NVML_FORWARD(nvmlDeviceGetComputeRunningProcesses_v3)
NVML_FORWARD(nvmlDeviceIsMigDeviceHandle)
NVML_FORWARD(nvmlDeviceGetMaxMigDeviceCount)
NVML_FORWARD(nvmlSystemGetDriverVersion)
NVML_FORWARD(nvmlSystemGetCudaDriverVersion)
NVML_FORWARD(nvmlSystemGetCudaDriverVersion_v2)
NVML_FORWARD(nvmlSystemGetNVMLVersion)

STANDIN_EXPORT const char *nvmlErrorString(int result) {
    (void)result;
    return "standin vCUDA NVML error";
}

/* ---- hooks: init, memory quota, launches ------------------------------------ */

STANDIN_EXPORT CUresult cuInit(unsigned int flags) {
    bump(IDX_cuInit);
    init_once();
    return ((CUresult(*)(unsigned))table_entry(IDX_cuInit))(flags);
}

STANDIN_EXPORT CUresult cuDriverGetVersion(int *version) {
    bump(IDX_cuDriverGetVersion);
    init_once();
    return ((CUresult(*)(int *))table_entry(IDX_cuDriverGetVersion))(version);
}

static CUresult metered_alloc(int idx, STANDIN_GENERIC_PARAMS) {
    bump(idx);
    unsigned long long size = (unsigned long long)(uintptr_t)a1;
    standin_generic_fn real = (standin_generic_fn)table_entry(idx);
    if (__atomic_load_n(&g_used, __ATOMIC_RELAXED) + size > g_quota)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult result = real(STANDIN_GENERIC_ARGS);
    if (result == CUDA_SUCCESS)
        __atomic_fetch_add(&g_used, size, __ATOMIC_RELAXED);
    return result;
}

STANDIN_EXPORT CUresult cuMemAlloc_v2(STANDIN_GENERIC_PARAMS) {
    return metered_alloc(IDX_cuMemAlloc_v2, STANDIN_GENERIC_ARGS);
}

/* vCUDA's legacy hook: the quota, then the driver's pre-3.2 cuMemAlloc. */
STANDIN_EXPORT CUresult cuMemAlloc(STANDIN_GENERIC_PARAMS) {
    return metered_alloc(IDX_cuMemAlloc, STANDIN_GENERIC_ARGS);
}

/* (size_t *free, size_t *total): the quota is the device, as the layer shows it. */
static CUresult quota_info(int idx, STANDIN_GENERIC_PARAMS) {
    bump(idx);
    CUresult result = ((standin_generic_fn)table_entry(idx))(STANDIN_GENERIC_ARGS);
    if (result == CUDA_SUCCESS && a0 && a1) {
        *(unsigned long long *)a0 = g_quota - __atomic_load_n(&g_used, __ATOMIC_RELAXED);
        *(unsigned long long *)a1 = g_quota;
    }
    return result;
}

STANDIN_EXPORT CUresult cuMemGetInfo_v2(STANDIN_GENERIC_PARAMS) {
    return quota_info(IDX_cuMemGetInfo_v2, STANDIN_GENERIC_ARGS);
}

STANDIN_EXPORT CUresult cuMemGetInfo(STANDIN_GENERIC_PARAMS) {
    return quota_info(IDX_cuMemGetInfo, STANDIN_GENERIC_ARGS);
}

static CUresult quota_total(int idx, STANDIN_GENERIC_PARAMS) {
    bump(idx);
    CUresult result = ((standin_generic_fn)table_entry(idx))(STANDIN_GENERIC_ARGS);
    if (result == CUDA_SUCCESS && a0)
        *(unsigned long long *)a0 = g_quota;
    return result;
}

STANDIN_EXPORT CUresult cuDeviceTotalMem_v2(STANDIN_GENERIC_PARAMS) {
    return quota_total(IDX_cuDeviceTotalMem_v2, STANDIN_GENERIC_ARGS);
}

STANDIN_EXPORT CUresult cuDeviceTotalMem(STANDIN_GENERIC_PARAMS) {
    return quota_total(IDX_cuDeviceTotalMem, STANDIN_GENERIC_ARGS);
}

/* Launches: counted (the SM limiter's place), then forwarded. */
FORWARD_GENERIC(cuLaunchKernel)
FORWARD_GENERIC(cuLaunchKernel_ptsz)
FORWARD_GENERIC(cuLaunchCooperativeKernel)
FORWARD_GENERIC(cuLaunchCooperativeKernel_ptsz)

#if defined(LAYER_FORK)
FORWARD_GENERIC(cuLaunchKernelEx)
FORWARD_GENERIC(cuLaunchKernelEx_ptsz)

#define FORWARD_EXACT(n, type, params, args)                                   \
    STANDIN_EXPORT CUresult n(params) {                                        \
        bump(IDX_##n);                                                         \
        return ((type)table_entry(IDX_##n))(args);                             \
    }
FORWARD_EXACT(cuTensorMapEncodeTiled, standin_tiled_fn, STANDIN_TILED_PARAMS, STANDIN_TILED_ARGS)
FORWARD_EXACT(cuTensorMapEncodeIm2col, standin_im2col_fn, STANDIN_IM2COL_PARAMS, STANDIN_IM2COL_ARGS)
FORWARD_EXACT(cuTensorMapReplaceAddress, standin_replace_fn, STANDIN_REPLACE_PARAMS, STANDIN_REPLACE_ARGS)

/* The fork's configuration block and one of its own helpers (exported, as its build exports every global). */
STANDIN_EXPORT char g_vcuda_config[256];

STANDIN_EXPORT int search_on_pids_table(int pid) {
    (void)pid;
    return 0;
}

STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
#endif /* LAYER_FORK */

/* ---- the v1 look-up ------------------------------------------------------------ */

STANDIN_EXPORT CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);

#if defined(LAYER_VCUDA_V105)
/* A plain forwarder through the table: the real driver's pointers, no hook, no init. */
STANDIN_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                         unsigned long long flags) {
    bump(IDX_cuGetProcAddress);
    return ((standin_gpa_fn)table_entry(IDX_cuGetProcAddress))(symbol, pfn, cudaVersion, flags);
}
#else
/* vCUDA master's hooks list (and the fork's, with its CUDA 12 hooks), by the name a caller asks for. */
static const struct {
    const char *name;
    void *fn;
} g_hooks[] = {
    {"cuDriverGetVersion", (void *)cuDriverGetVersion},
    {"cuInit", (void *)cuInit},
    {"cuMemAlloc_v2", (void *)cuMemAlloc_v2},
    {"cuMemAlloc", (void *)cuMemAlloc},
    {"cuDeviceTotalMem_v2", (void *)cuDeviceTotalMem_v2},
    {"cuDeviceTotalMem", (void *)cuDeviceTotalMem},
    {"cuMemGetInfo_v2", (void *)cuMemGetInfo_v2},
    {"cuMemGetInfo", (void *)cuMemGetInfo},
    {"cuLaunchKernel_ptsz", (void *)cuLaunchKernel_ptsz},
    {"cuLaunchKernel", (void *)cuLaunchKernel},
    {"cuLaunchCooperativeKernel_ptsz", (void *)cuLaunchCooperativeKernel_ptsz},
    {"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel},
#if defined(LAYER_FORK)
    {"cuLaunchKernelEx_ptsz", (void *)cuLaunchKernelEx_ptsz},
    {"cuLaunchKernelEx", (void *)cuLaunchKernelEx},
    {"cuGetProcAddress_v2", (void *)cuGetProcAddress_v2},
    {"cuGetProcAddress", (void *)cuGetProcAddress},
#endif
};

/* The swap: whatever the driver handed out for `symbol` is replaced by the hook of that very name. */
static void swap_in_hook(const char *symbol, void **pfn) {
    for (size_t k = 0; symbol && k < sizeof g_hooks / sizeof g_hooks[0]; k++)
        if (strcmp(symbol, g_hooks[k].name) == 0)
            *pfn = g_hooks[k].fn;
}

STANDIN_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                         unsigned long long flags) {
    bump(IDX_cuGetProcAddress);
    init_once();
    CUresult result =
        ((standin_gpa_fn)table_entry(IDX_cuGetProcAddress))(symbol, pfn, cudaVersion, flags);
    if (result == CUDA_SUCCESS)
        swap_in_hook(symbol, pfn);
    return result;
}

#if defined(LAYER_FORK)
/* The real driver writes the pointer and the status; the swap then ignores the version and the flags. */
STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                            unsigned long long flags, int *symbolStatus) {
    bump(IDX_cuGetProcAddress_v2);
    init_once();
    CUresult result = ((standin_gpa2_fn)table_entry(IDX_cuGetProcAddress_v2))(symbol, pfn, cudaVersion,
                                                                             flags, symbolStatus);
    if (result == CUDA_SUCCESS)
        swap_in_hook(symbol, pfn);
    return result;
}
#endif
#endif

#endif /* a vCUDA build */
