/*
 * CUDA 12+'s entry-point look-up, for a layer that has no cuGetProcAddress_v2 (built against older headers)
 * or whose look-ups cannot be trusted with it (a vCUDA build: its CUDA 12 forks export one that swaps by
 * base name).
 * A caller names an entry point by its base name, the CUDA version it was built for and a per-thread-stream
 * flag (("cuMemAlloc", 13000, 0)); proc_versions.h maps that to the exact symbol the driver would hand out
 * (cuMemAlloc_v2), and the answer is the layer's export of that symbol (metered) wherever it has one,
 * else what tmaguard.h's order gives. The layer's own look-ups are never asked: tkestack vCUDA's v1 swaps in
 * its hook by the requested base name, the legacy ABI for cuMemAlloc & co. (master, and the CUDA 12 fork's
 * cuGetProcAddress_v2 alike), or forwards every name to the real driver unmetered, calling through a table
 * its init has not filled yet (v1.0.5)
 * (docs/design.md §2.2). In the overlay this implementation also replaces the layer's v1 cuGetProcAddress
 * (its callers, CUDA 11.3-11.8 runtimes, get the same exact symbols).
 */
#include "tmaguard.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "proc_versions.h"

typedef CUresult (*proc_address_v2_fn)(const char *, void **, int, cuuint64_t, int *);

static int proc_version_order(const void *key, const void *row) {
    return strcmp(key, ((const struct proc_version *)row)->name);
}

/*
 * The symbol that implements entry point `name` for a caller built against CUDA `cuda_version`, as the
 * driver chooses it: the newest ABI not newer than the caller, its per-thread-default-stream variant when
 * the flags ask for it. NULL (status: version not sufficient) when every ABI is newer than the caller. A
 * name the table does not know (newer than the headers it was generated from) stands for itself.
 */
static const char *versioned_symbol(const char *name, int cuda_version, cuuint64_t flags, int *status) {
    size_t count = sizeof proc_versions / sizeof proc_versions[0];
    const struct proc_version *hit = bsearch(name, proc_versions, count, sizeof *hit, proc_version_order);
    if (hit == NULL) return name;
    while (hit > proc_versions && strcmp(hit[-1].name, name) == 0) hit--;
    const struct proc_version *best = NULL;
    for (; hit < proc_versions + count && strcmp(hit->name, name) == 0; hit++)
        if (hit->version <= cuda_version) best = hit; /* rows of one name are in version order */
    if (best == NULL) {
        *status = PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return NULL;
    }
    return (flags & PER_THREAD_DEFAULT_STREAM) && best->per_thread ? best->per_thread : best->symbol;
}

/* A symbol newer than this library's tables: the layer's export, else the real driver's own look-up (a
   name the layer does not know, it does not meter). */
static void *newer_symbol(const char *symbol, const char *exact, int cuda_version, cuuint64_t flags,
                          int *source) {
    void *fn = tmaguard_layer_symbol(exact);
    if (fn != NULL) {
        *source = SOURCE_LAYER_SYMBOL;
        return fn;
    }
    void *real = tmaguard_real_driver();
    proc_address_v2_fn look_up = real ? (proc_address_v2_fn)dlsym(real, "cuGetProcAddress_v2") : NULL;
    int status = PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (look_up != NULL && look_up(symbol, &fn, cuda_version, flags, &status) == CUDA_SUCCESS &&
        fn != NULL && status == PROC_ADDRESS_SUCCESS) {
        *source = SOURCE_REAL_DRIVER;
        return fn;
    }
    *source = SOURCE_NONE;
    return NULL;
}

static int v2_source = SOURCE_UNRESOLVED;

static CUresult proc_address_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
                                int *status) {
    if (pfn == NULL || symbol == NULL) return CUDA_ERROR_INVALID_VALUE;
    __atomic_store_n(&v2_source, SOURCE_OWN, __ATOMIC_RELAXED);
    *pfn = NULL;
    int not_found = PROC_ADDRESS_SYMBOL_NOT_FOUND;
    const char *exact = versioned_symbol(symbol, cuda_version, flags, &not_found);
    int source = SOURCE_NONE;
    void *fn = NULL;
    if (exact != NULL) {
#ifdef TMAGUARD_OVERLAY
        fn = tmaguard_entry_point(exact, &source);
        if (fn == NULL && source == SOURCE_NONE && strcmp(exact, symbol) == 0)
            fn = newer_symbol(symbol, exact, cuda_version, flags, &source);
#else
        fn = newer_symbol(symbol, exact, cuda_version, flags, &source);
#endif
    }
    tmaguard_trace("cuGetProcAddress_v2(%s, %d, %llu) -> %s (source %d)", symbol, cuda_version,
                   (unsigned long long)flags, fn ? exact : "not found", source);
    *pfn = fn;
    if (status != NULL) *status = fn != NULL ? PROC_ADDRESS_SUCCESS : not_found;
    return fn != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

#ifdef TMAGUARD_OVERLAY
static CUresult proc_address_v1(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags) {
    return proc_address_v2(symbol, pfn, cuda_version, flags, NULL);
}

/* Our look-ups where the layer has no cuGetProcAddress_v2 of its own, or where its look-ups swap in hooks by
   base name (a vCUDA build, its CUDA 12 forks included: ("cuMemAlloc", 13000) would get its legacy
   cuMemAlloc hook, which calls the driver's pre-3.2 ABI: CUDA_ERROR_INVALID_CONTEXT under a runtime's
   context). NULL otherwise: a layer whose look-ups know its hooks by exact symbol answers them itself, and
   entry_points.c binds its exports. */
void *tmaguard_own_proc_address(const char *symbol) {
    if (strncmp(symbol, "cuGetProcAddress", 16) != 0) return NULL;
    if (tmaguard_layer_symbol("cuGetProcAddress_v2") != NULL && !tmaguard_layer_is_vcuda()) return NULL;
    if (strcmp(symbol, "cuGetProcAddress_v2") == 0) return (void *)proc_address_v2;
    if (strcmp(symbol, "cuGetProcAddress") == 0) return (void *)proc_address_v1;
    return NULL;
}
#else
/* The proc-address shim, loaded RTLD_GLOBAL for vLLM's extensions where libcuda.so.1 was loaded first. */
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
                                    int *status) {
    return proc_address_v2(symbol, pfn, cuda_version, flags, status);
}

int tmaguard_proc_address_source(const char *name) {
    return strcmp(name, "cuGetProcAddress_v2") == 0 ? __atomic_load_n(&v2_source, __ATOMIC_RELAXED)
                                                    : SOURCE_NONE;
}
#endif
