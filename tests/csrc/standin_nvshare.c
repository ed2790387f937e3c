/*
 * Stand-in for nvshare's libnvshare.so (grgalex/nvshare 1a8f211), preloaded (LD_PRELOAD, from its device
 * plugin) in front of NVIDIA's own libcuda.so.1, which stays in place:
 * - no constructor: loading it does nothing. Its first cuInit / cuGetProcAddress / cuGetProcAddress_v2 opens
 *   the driver by its unversioned name (dlopen("libcuda.so")) and starts a client thread that connects to
 *   the node's scheduler at $STANDIN_NVSHARE_ROOT/var/run/nvshare/scheduler.sock while the caller waits on
 *   a semaphore. Without a scheduler the client thread prints nvshare's two lines and calls exit(1) (under
 *   torch, whose exit handlers need the GIL the waiting caller holds, the real one then hangs);
 * - cuMemAlloc_v2 becomes the driver's cuMemAllocManaged (counted), capped per process at what its
 *   cuMemGetInfo_v2 says is free: total - 1536 MiB, always;
 * - cuLaunchKernel waits for the GPU lock (counted) and calls cuCtxSynchronize every `window` launches (1,
 *   doubling to 2048): inside a CUDA-graph capture that call is refused, which is why vLLM dies capturing.
 *   cuLaunchKernelEx, cuLaunchKernel_ptsz and graph launches are not hooked: they skip the lock;
 * - its cuGetProcAddress(_v2) swap in its hook by base name, whatever the version and flags ask;
 * - overrides dlsym for the whole process (its hooked names, any handle).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "standin_entry_points.h"

#define RESERVED (1536ULL << 20)
#define MAX_WINDOW 2048

#define HOOKED(X)                                                              \
    X(cuInit)                                                                  \
    X(cuGetProcAddress)                                                        \
    X(cuGetProcAddress_v2)                                                     \
    X(cuMemAlloc_v2)                                                           \
    X(cuMemGetInfo_v2)                                                         \
    X(cuLaunchKernel)

enum {
#define X(n) IDX_##n,
    HOOKED(X)
#undef X
        N_HOOKED
};
static const char *const g_names[N_HOOKED] = {
#define X(n) #n,
    HOOKED(X)
#undef X
};

static long long g_calls[N_HOOKED];
static long long g_managed, g_syncs;
static unsigned long long g_used;
static int g_window = 1, g_since_sync;
static void *g_driver;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static sem_t g_registered;

#include "standin_dlsym.h"

static void bump(int idx) { __atomic_fetch_add(&g_calls[idx], 1, __ATOMIC_RELAXED); }

static void *driver_fn(const char *name) { return g_driver ? real_dlsym()(g_driver, name) : NULL; }

static void fatal(const char *line) {
    fprintf(stderr, "[NVSHARE][FATAL]: %s\n", line);
    exit(1);
}

static void *client(void *unused) {
    (void)unused;
    char path[PATH_MAX];
    const char *root = getenv("STANDIN_NVSHARE_ROOT");
    snprintf(path, sizeof path, "%s/var/run/nvshare/scheduler.sock", root ? root : "");
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (strlen(path) >= sizeof address.sun_path || fd < 0)
        fatal("Condition failed: nvshare_connect(&rsock, nvscheduler_socket_path) == 0");
    strcpy(address.sun_path, path);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        fprintf(stderr, "[NVSHARE][INFO]: Failed to connect to UNIX socket at %s\n", path);
        fatal("Condition failed: nvshare_connect(&rsock, nvscheduler_socket_path) == 0");
    }
    sem_post(&g_registered); /* the scheduler's first answer: the caller may go on */
    return NULL;
}

static void initialise(void) {
    g_driver = dlopen("libcuda.so", RTLD_LAZY); /* the unversioned name, as nvshare opens it */
    if (!g_driver)
        fatal(dlerror());
    sem_init(&g_registered, 0, 0);
    pthread_t thread;
    if (pthread_create(&thread, NULL, client, NULL) != 0)
        fatal("cannot start the client thread");
    pthread_detach(thread);
    sem_wait(&g_registered);
}

static void ensure_initialised(void) { pthread_once(&g_once, initialise); }

STANDIN_EXPORT CUresult cuInit(unsigned int flags) {
    bump(IDX_cuInit);
    ensure_initialised();
    CUresult (*fn)(unsigned) = (CUresult(*)(unsigned))driver_fn("cuInit");
    return fn ? fn(flags) : CUDA_ERROR_STUB_LIBRARY;
}

/* (size_t *free, size_t *total): free is the total less nvshare's reserve, whatever is really free. */
STANDIN_EXPORT CUresult cuMemGetInfo_v2(STANDIN_GENERIC_PARAMS) {
    bump(IDX_cuMemGetInfo_v2);
    standin_generic_fn fn = (standin_generic_fn)driver_fn("cuMemGetInfo_v2");
    CUresult result = fn ? fn(STANDIN_GENERIC_ARGS) : CUDA_ERROR_STUB_LIBRARY;
    if (result == CUDA_SUCCESS && a0 && a1)
        *(unsigned long long *)a0 = *(unsigned long long *)a1 - RESERVED;
    return result;
}

/* Managed memory, capped per process only (no quota across processes). */
STANDIN_EXPORT CUresult cuMemAlloc_v2(STANDIN_GENERIC_PARAMS) {
    bump(IDX_cuMemAlloc_v2);
    unsigned long long size = (unsigned long long)(size_t)a1, free_bytes = 0, total = 0;
    cuMemGetInfo_v2((void *)&free_bytes, (void *)&total, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    if (__atomic_load_n(&g_used, __ATOMIC_RELAXED) + size > free_bytes)
        return CUDA_ERROR_OUT_OF_MEMORY;
    standin_generic_fn managed = (standin_generic_fn)driver_fn("cuMemAllocManaged");
    if (!managed) /* the stand-in driver has no managed memory: its plain allocation stands in */
        managed = (standin_generic_fn)driver_fn("cuMemAlloc_v2");
    CUresult result = managed ? managed(STANDIN_GENERIC_ARGS) : CUDA_ERROR_STUB_LIBRARY;
    if (result == CUDA_SUCCESS) {
        __atomic_fetch_add(&g_used, size, __ATOMIC_RELAXED);
        __atomic_fetch_add(&g_managed, 1, __ATOMIC_RELAXED);
    }
    return result;
}

/* The GPU lock, then the launch, then every `window` launches a synchronisation of the context. */
STANDIN_EXPORT CUresult cuLaunchKernel(STANDIN_GENERIC_PARAMS) {
    bump(IDX_cuLaunchKernel);
    standin_generic_fn fn = (standin_generic_fn)driver_fn("cuLaunchKernel");
    CUresult result = fn ? fn(STANDIN_GENERIC_ARGS) : CUDA_ERROR_STUB_LIBRARY;
    if (++g_since_sync >= g_window) {
        CUresult (*sync)(void) = (CUresult(*)(void))driver_fn("cuCtxSynchronize");
        if (sync)
            sync(); /* its result is only logged by nvshare */
        __atomic_fetch_add(&g_syncs, 1, __ATOMIC_RELAXED);
        g_since_sync = 0;
        g_window = g_window < MAX_WINDOW ? g_window * 2 : MAX_WINDOW;
    }
    return result;
}

STANDIN_EXPORT CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);
STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

/* Its hooks by the base name a caller asks for. */
static void *hook_for(const char *symbol) {
    static const struct {
        const char *name;
        void *fn;
    } hooks[] = {
        {"cuInit", (void *)cuInit},
        {"cuGetProcAddress", (void *)cuGetProcAddress},
        {"cuMemAlloc", (void *)cuMemAlloc_v2},
        {"cuMemGetInfo", (void *)cuMemGetInfo_v2},
        {"cuLaunchKernel", (void *)cuLaunchKernel},
    };
    for (size_t k = 0; symbol && k < sizeof hooks / sizeof hooks[0]; k++)
        if (strcmp(symbol, hooks[k].name) == 0)
            return hooks[k].fn;
    return NULL;
}

STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                            unsigned long long flags, int *symbolStatus) {
    bump(IDX_cuGetProcAddress_v2);
    ensure_initialised();
    void *hook = hook_for(symbol);
    if (hook && pfn) {
        *pfn = hook;
        if (symbolStatus)
            *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    standin_gpa2_fn fn = (standin_gpa2_fn)driver_fn("cuGetProcAddress_v2");
    return fn ? fn(symbol, pfn, cudaVersion, flags, symbolStatus) : CUDA_ERROR_STUB_LIBRARY;
}

STANDIN_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                         unsigned long long flags) {
    bump(IDX_cuGetProcAddress);
    ensure_initialised();
    void *hook = hook_for(symbol);
    if (hook && pfn) {
        *pfn = hook;
        return CUDA_SUCCESS;
    }
    standin_gpa_fn fn = (standin_gpa_fn)driver_fn("cuGetProcAddress");
    return fn ? fn(symbol, pfn, cudaVersion, flags) : CUDA_ERROR_STUB_LIBRARY;
}

/* The process-wide look-up: its hooked names, whatever the handle. */
STANDIN_EXPORT void *dlsym(void *handle, const char *symbol) {
    for (int i = 0; strncmp(symbol, "cu", 2) == 0 && i < N_HOOKED; i++)
        if (strcmp(symbol, g_names[i]) == 0)
            return real_dlsym()(RTLD_DEFAULT, symbol);
    return real_dlsym()(handle, symbol);
}

/* Calls of a hooked name; "managed" and "syncs": the managed allocations and the synchronisations made. */
STANDIN_EXPORT long long standin_nvshare_calls(const char *name) {
    if (name && strcmp(name, "managed") == 0)
        return __atomic_load_n(&g_managed, __ATOMIC_RELAXED);
    if (name && strcmp(name, "syncs") == 0)
        return __atomic_load_n(&g_syncs, __ATOMIC_RELAXED);
    for (int i = 0; name && i < N_HOOKED; i++)
        if (strcmp(name, g_names[i]) == 0)
            return __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
    return -1;
}
