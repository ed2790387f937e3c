/*
 * Driver entry points a GPU-sharing layer's libcuda.so.1 lacks, forwarded to real implementations.
 *
 * Feature groups (any combination, chosen at build time; see setup.py):
 *   TMAGUARD_ENCODERS         the four tensor-map encoders
 *   TMAGUARD_PROC_ADDRESS_V2  cuGetProcAddress_v2, built on the layer's own look-ups
 *   TMAGUARD_LAUNCH_EX        cuLaunchKernelEx, translated to the layer's metered cuLaunchKernel
 * Two ways to be loaded:
 *   shim     (default): loaded RTLD_GLOBAL before vLLM's first extension import; the layer is whatever
 *            answers dlopen("libcuda.so.1") once something loads it.
 *   overlay  (TMAGUARD_OVERLAY): SONAME libcuda.so.1, DT_NEEDED on the layer's file by absolute path (a
 *            placeholder the guard patches at run time), loaded before anything else loads libcuda.so.1,
 *            so handle-scoped look-ups (cudart, Triton) find the layer's functions and these.
 * Only the groups the layer lacks are built into the library the guard loads, so no name the layer exports
 * is shadowed (docs/design.md §2.6).
 *
 * Resolution happens once, on first use, under a lock: CUDA is initialised by then. Order (docs/design.md
 * §2.4, §2.5): the layer's cuGetProcAddress_v2, its v1 cuGetProcAddress, then a real driver already
 * loaded in the process (the copy the layer opened: its context is the live one), then the real driver
 * file the guard found, opened only while the layer is mapped. After that each encoder call is one load
 * and one jump.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef uint64_t cuuint64_t;
typedef uint32_t cuuint32_t;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    PROC_ADDRESS_SUCCESS = 0,
    PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
    PER_THREAD_DEFAULT_STREAM = 2, /* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */
};

/* Where a name was resolved from; read by the guard's record and by tests. */
enum {
    SOURCE_NONE = -1,
    SOURCE_UNRESOLVED = 0,
    SOURCE_LAYER_PROC_ADDRESS_V2 = 1,
    SOURCE_LAYER_PROC_ADDRESS = 2,
    SOURCE_REAL_DRIVER = 3,
    SOURCE_LAYER_SYMBOL = 4,
};

typedef CUresult (*proc_address_v2_fn)(const char *, void **, int, cuuint64_t, int *);
typedef CUresult (*proc_address_v1_fn)(const char *, void **, int, cuuint64_t);

static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;
static char real_driver_path[4096];

EXPORT void tmaguard_shim_set_real_driver(const char *path) {
    pthread_mutex_lock(&resolve_lock);
    strncpy(real_driver_path, path ? path : "", sizeof real_driver_path - 1);
    real_driver_path[sizeof real_driver_path - 1] = '\0';
    pthread_mutex_unlock(&resolve_lock);
}

#ifdef TMAGUARD_OVERLAY
/* Patched by the guard with the layer's absolute path, as is the identical DT_NEEDED string (setup.py). */
static const char layer_path[] = TMAGUARD_LAYER_PLACEHOLDER;

static void *layer_handle(void) { return dlopen(layer_path, RTLD_NOW | RTLD_NOLOAD); }
#else
/* The layer's libcuda.so.1, only if something already loaded it; never loads it (docs/design.md §2.5). */
static void *layer_handle(void) { return dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD); }
#endif

static int is_own_address(const void *fn);

#define LOAD(slot) __atomic_load_n(&(slot), __ATOMIC_ACQUIRE)
#define STORE(slot, value) __atomic_store_n(&(slot), (value), __ATOMIC_RELEASE)

#define MAX_LOADED 64

struct loaded_names {
    int count;
    char names[MAX_LOADED][512];
};

static int collect_driver_file(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct loaded_names *found = data;
    const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    if (slash != NULL && strncmp(slash + 1, "libcuda.so", 10) == 0 && found->count < MAX_LOADED &&
        strlen(info->dlpi_name) < sizeof found->names[0])
        strcpy(found->names[found->count++], info->dlpi_name);
    return 0;
}

/* A real driver the process has already loaded (the layer opened it, RTLD_LOCAL): a libcuda.so* that is
   neither the layer nor this library and exports the encoders. NULL if there is none. dlopen is not
   called from inside dl_iterate_phdr's callback: the loader's lock is held there. */
static void *loaded_real_driver(void *layer) {
    static struct loaded_names found; /* under resolve_lock */
    found.count = 0;
    dl_iterate_phdr(collect_driver_file, &found);
    for (int i = 0; i < found.count; i++) {
        void *handle = dlopen(found.names[i], RTLD_NOW | RTLD_NOLOAD);
        if (handle == NULL) continue;
        void *encoder = dlsym(handle, "cuTensorMapEncodeTiled");
        if (handle != layer && encoder != NULL && !is_own_address(encoder)) return handle;
        dlclose(handle);
    }
    return NULL;
}

/* Looks one driver entry point up through the layer, then a real driver (flags: the per-thread default
   stream flag of cuGetProcAddress). Caller holds the lock. */
__attribute__((unused)) static void *find_real(void *layer, const char *name, int min_cuda_version,
                                               cuuint64_t flags, int *source) {
    void *fn = NULL;
    int status = PROC_ADDRESS_SYMBOL_NOT_FOUND;

    proc_address_v2_fn v2 = (proc_address_v2_fn)dlsym(layer, "cuGetProcAddress_v2");
    if (v2 != NULL && !is_own_address((void *)v2) &&
        v2(name, &fn, min_cuda_version, flags, &status) == CUDA_SUCCESS && fn != NULL &&
        status == PROC_ADDRESS_SUCCESS && !is_own_address(fn)) {
        *source = SOURCE_LAYER_PROC_ADDRESS_V2;
        return fn;
    }
    fn = NULL;
    proc_address_v1_fn v1 = (proc_address_v1_fn)dlsym(layer, "cuGetProcAddress");
    if (v1 != NULL && !is_own_address((void *)v1) &&
        v1(name, &fn, min_cuda_version, flags) == CUDA_SUCCESS && fn != NULL && !is_own_address(fn)) {
        *source = SOURCE_LAYER_PROC_ADDRESS;
        return fn;
    }
    char exact[128];
    snprintf(exact, sizeof exact, "%s%s", name, flags & PER_THREAD_DEFAULT_STREAM ? "_ptsz" : "");
    void *real = loaded_real_driver(layer);
    if (real == NULL && real_driver_path[0] != '\0')
        real = dlopen(real_driver_path, RTLD_NOW | RTLD_LOCAL); /* the layer is mapped: not the first */
    if (real != NULL && real != layer) {
        fn = dlsym(real, exact);
        if (fn != NULL && !is_own_address(fn)) {
            *source = SOURCE_REAL_DRIVER;
            return fn;
        }
    }
    *source = SOURCE_NONE;
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
#ifdef TMAGUARD_ENCODERS

typedef CUresult (*encode_tiled_fn)(void *, int, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, int,
                                    int, int, int);
typedef CUresult (*encode_im2col_fn)(void *, int, cuuint32_t, void *, const cuuint64_t *,
                                     const cuuint64_t *, const int *, const int *, cuuint32_t,
                                     cuuint32_t, const cuuint32_t *, int, int, int, int);
typedef CUresult (*encode_im2col_wide_fn)(void *, int, cuuint32_t, void *, const cuuint64_t *,
                                          const cuuint64_t *, int, int, cuuint32_t, cuuint32_t,
                                          const cuuint32_t *, int, int, int, int, int);
typedef CUresult (*replace_address_fn)(void *, void *);

#define TILED_PARAMS                                                                              \
    void *map, int type, cuuint32_t rank, void *addr, const cuuint64_t *dim,                      \
        const cuuint64_t *stride, const cuuint32_t *box, const cuuint32_t *estride, int inter,    \
        int swz, int l2, int oob
#define TILED_ARGS map, type, rank, addr, dim, stride, box, estride, inter, swz, l2, oob
#define IM2COL_PARAMS                                                                             \
    void *map, int type, cuuint32_t rank, void *addr, const cuuint64_t *dim,                      \
        const cuuint64_t *stride, const int *lower, const int *upper, cuuint32_t channels,        \
        cuuint32_t pixels, const cuuint32_t *estride, int inter, int swz, int l2, int oob
#define IM2COL_ARGS map, type, rank, addr, dim, stride, lower, upper, channels, pixels, estride, \
    inter, swz, l2, oob
#define IM2COL_WIDE_PARAMS                                                                        \
    void *map, int type, cuuint32_t rank, void *addr, const cuuint64_t *dim,                      \
        const cuuint64_t *stride, int lower, int upper, cuuint32_t channels, cuuint32_t pixels,   \
        const cuuint32_t *estride, int inter, int mode, int swz, int l2, int oob
#define IM2COL_WIDE_ARGS map, type, rank, addr, dim, stride, lower, upper, channels, pixels,     \
    estride, inter, mode, swz, l2, oob
#define REPLACE_PARAMS void *map, void *addr
#define REPLACE_ARGS map, addr

/* One X-macro row per encoder: name, function type, parameters, arguments, and the CUDA version that
   introduced it (asked of cuGetProcAddress). */
#define ENCODERS(X)                                                                               \
    X(cuTensorMapEncodeTiled, encode_tiled_fn, TILED_PARAMS, TILED_ARGS, 12000)                   \
    X(cuTensorMapEncodeIm2col, encode_im2col_fn, IM2COL_PARAMS, IM2COL_ARGS, 12000)               \
    X(cuTensorMapEncodeIm2colWide, encode_im2col_wide_fn, IM2COL_WIDE_PARAMS, IM2COL_WIDE_ARGS,   \
      12080)                                                                                      \
    X(cuTensorMapReplaceAddress, replace_address_fn, REPLACE_PARAMS, REPLACE_ARGS, 12000)

/* Per encoder: the slot every call jumps through (first a resolver), the fallback that reports
   "not supported", and where the name was resolved from. */
#define DECLARE(name, type, params, args, version)                                               \
    CUresult tmaguard_own_##name(params); /* the exported trampoline, by a name nobody else has */ \
    static CUresult resolve_##name(params);                                                       \
    static CUresult unsupported_##name(params);                                                   \
    static type slot_##name __attribute__((used)) = resolve_##name;                               \
    static int source_##name = SOURCE_UNRESOLVED;
ENCODERS(DECLARE)

/*
 * The exported entry points are trampolines: one load of the slot and one indirect jump, whatever the
 * arity (a C forwarder of 12 to 16 arguments copies the stack arguments instead of tail-calling).
 */
#if defined(__x86_64__)
#define TRAMPOLINE(name, type, params, args, version)                                            \
    __asm__(".text\n.globl " #name "\n.type " #name ",@function\n"                              \
            ".hidden tmaguard_own_" #name "\n.type tmaguard_own_" #name ",@function\n"           \
            ".p2align 4\n" #name ":\ntmaguard_own_" #name ":\n"                                  \
            "\tjmp *slot_" #name "(%rip)\n.size " #name ", .-" #name "\n");
#elif defined(__aarch64__)
#define TRAMPOLINE(name, type, params, args, version)                                            \
    __asm__(".text\n.globl " #name "\n.type " #name ",%function\n"                              \
            ".hidden tmaguard_own_" #name "\n.type tmaguard_own_" #name ",%function\n"           \
            ".p2align 4\n" #name ":\ntmaguard_own_" #name ":\n"                                  \
            "\tadrp x16, slot_" #name "\n\tldr x16, [x16, #:lo12:slot_" #name "]\n\tbr x16\n"   \
            ".size " #name ", .-" #name "\n");
#else
#error "tmaguard: only x86-64 and aarch64 are supported"
#endif
ENCODERS(TRAMPOLINE)

static int resolve_encoders(void) {
    int ready = 1;
    pthread_mutex_lock(&resolve_lock);
    if (source_cuTensorMapEncodeTiled == SOURCE_UNRESOLVED) {
        void *layer = layer_handle();
        if (layer == NULL) {
            ready = 0; /* no driver yet: no context can exist, try again on the next call */
        } else {
#define RESOLVE(name, type, params, args, version)                                               \
            {                                                                                     \
                type fn = (type)find_real(layer, #name, version, 0, &source_##name);              \
                STORE(slot_##name, fn != NULL ? fn : unsupported_##name);                         \
            }
            ENCODERS(RESOLVE)
            dlclose(layer);
        }
    }
    pthread_mutex_unlock(&resolve_lock);
    return ready;
}

#define DEFINE(name, type, params, args, version)                                                \
    static CUresult resolve_##name(params) {                                                      \
        if (!resolve_encoders()) return CUDA_ERROR_NOT_INITIALIZED;                               \
        return LOAD(slot_##name)(args);                                                           \
    }                                                                                             \
    static CUresult unsupported_##name(params) { return CUDA_ERROR_NOT_SUPPORTED; }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
ENCODERS(DEFINE)
#pragma GCC diagnostic pop

#endif /* TMAGUARD_ENCODERS */

/* ------------------------------------------------------------------------------------------------ */
#ifdef TMAGUARD_LAUNCH_EX

/* CUlaunchConfig and CUlaunchAttribute as in cuda.h (CUDA 12+). */
typedef struct {
    int id;
    char pad[8 - sizeof(int)];
    union {
        char raw[64];
        int integer;
        struct {
            unsigned x, y, z;
        } cluster;
    } value;
} launch_attribute;

typedef struct {
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
    void *stream;
    launch_attribute *attrs;
    unsigned num_attrs;
} launch_config;

enum {
    ATTR_IGNORE = 0,
    ATTR_COOPERATIVE = 2,
    ATTR_CLUSTER_DIMENSION = 4,
    ATTR_CLUSTER_SCHEDULING_POLICY = 5,
    ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
};

typedef CUresult (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, void *, void **, void **);
typedef CUresult (*cooperative_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, void *, void **);
typedef CUresult (*launch_ex_fn)(const launch_config *, void *, void **, void **);

/* The layer's launches and the real cuLaunchKernelEx, for legacy-stream [0] and per-thread-default-stream
   [1] callers (cuLaunchKernelEx_ptsz: a NULL stream is the calling thread's default stream). */
static struct launch_path {
    launch_fn launch;
    cooperative_fn cooperative;
    launch_ex_fn real_ex;
} launch_paths[2];
static int launch_source = SOURCE_UNRESOLVED;
static long long launch_counts[3]; /* metered via cuLaunchKernel, via the cooperative call, unmetered */

/* Which call expresses this launch: 0 plain, 1 cooperative, 2 only the Ex call (attributes that
   cuLaunchKernel cannot carry). */
static int classify(const launch_config *config) {
    int cooperative = 0;
    for (unsigned i = 0; i < config->num_attrs; i++) {
        const launch_attribute *attr = &config->attrs[i];
        switch (attr->id) {
        case ATTR_IGNORE:
            break;
        case ATTR_COOPERATIVE:
            cooperative = attr->value.integer != 0;
            break;
        case ATTR_CLUSTER_DIMENSION:
            if (attr->value.cluster.x > 1 || attr->value.cluster.y > 1 || attr->value.cluster.z > 1)
                return 2;
            break;
        case ATTR_CLUSTER_SCHEDULING_POLICY:
        case ATTR_PROGRAMMATIC_STREAM_SERIALIZATION:
            if (attr->value.integer != 0) return 2;
            break;
        default:
            return 2;
        }
    }
    return cooperative;
}

static void resolve_launch(void) {
    pthread_mutex_lock(&resolve_lock);
    if (launch_source == SOURCE_UNRESOLVED) {
        void *layer = layer_handle();
        if (layer != NULL) {
            int source = SOURCE_NONE;
            for (int per_thread = 0; per_thread < 2; per_thread++) {
                struct launch_path *path = &launch_paths[per_thread];
                path->launch = (launch_fn)dlsym(layer, per_thread ? "cuLaunchKernel_ptsz" : "cuLaunchKernel");
                path->cooperative = (cooperative_fn)dlsym(
                    layer, per_thread ? "cuLaunchCooperativeKernel_ptsz" : "cuLaunchCooperativeKernel");
                path->real_ex = (launch_ex_fn)find_real(
                    layer, "cuLaunchKernelEx", 11060, per_thread ? PER_THREAD_DEFAULT_STREAM : 0, &source);
                if (!per_thread) launch_source = source;
            }
            if (launch_source == SOURCE_NONE && launch_paths[0].launch) launch_source = SOURCE_LAYER_SYMBOL;
            dlclose(layer);
        }
    }
    pthread_mutex_unlock(&resolve_lock);
}

static CUresult launch_ex(int per_thread, const launch_config *config, void *function, void **params,
                          void **extra) {
    if (config == NULL || (config->num_attrs > 0 && config->attrs == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    resolve_launch();
    const struct launch_path *path = &launch_paths[per_thread];
    int kind = classify(config);
    if (kind == 1 && (path->cooperative == NULL || extra != NULL)) kind = 2;
    if (kind == 0 && path->launch == NULL) kind = 2;
    __atomic_fetch_add(&launch_counts[kind], 1, __ATOMIC_RELAXED);
    switch (kind) {
    case 0:
        return path->launch(function, config->grid_x, config->grid_y, config->grid_z, config->block_x,
                            config->block_y, config->block_z, config->shared_bytes, config->stream,
                            params, extra);
    case 1:
        return path->cooperative(function, config->grid_x, config->grid_y, config->grid_z,
                                 config->block_x, config->block_y, config->block_z,
                                 config->shared_bytes, config->stream, params);
    default:
        return path->real_ex ? path->real_ex(config, function, params, extra) : CUDA_ERROR_NOT_SUPPORTED;
    }
}

EXPORT CUresult cuLaunchKernelEx(const launch_config *config, void *function, void **params,
                                 void **extra) {
    return launch_ex(0, config, function, params, extra);
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const launch_config *config, void *function, void **params,
                                      void **extra) {
    return launch_ex(1, config, function, params, extra);
}

/* Launches so far: through the layer's cuLaunchKernel, its cooperative launch, and unmetered (forwarded
   to the real driver's cuLaunchKernelEx because cuLaunchKernel cannot carry their attributes). */
EXPORT void tmaguard_launch_counts(long long out[3]) {
    for (int i = 0; i < 3; i++) out[i] = __atomic_load_n(&launch_counts[i], __ATOMIC_RELAXED);
}

#endif /* TMAGUARD_LAUNCH_EX */

/* ------------------------------------------------------------------------------------------------ */
/* Names this library supplies (exact symbols), for cuGetProcAddress_v2. */
__attribute__((unused)) static void *own_symbol(const char *name) {
#ifdef TMAGUARD_ENCODERS
#define OWN_ENCODER(n, type, params, args, version)                                              \
    if (strcmp(name, #n) == 0) return (void *)tmaguard_own_##n;
    ENCODERS(OWN_ENCODER)
#endif
#ifdef TMAGUARD_LAUNCH_EX
    if (strcmp(name, "cuLaunchKernelEx") == 0) return (void *)cuLaunchKernelEx;
    if (strcmp(name, "cuLaunchKernelEx_ptsz") == 0) return (void *)cuLaunchKernelEx_ptsz;
#endif
    (void)name;
    return NULL;
}

#ifdef TMAGUARD_PROC_ADDRESS_V2

#include "proc_versions.h"

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

static int proc_address_source = SOURCE_UNRESOLVED;
static void *proc_address_layer; /* kept open: libcuda.so.1 is never unloaded anyway */
static proc_address_v2_fn layer_v2;
static proc_address_v1_fn layer_v1;

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                                    cuuint64_t flags, int *status);

/*
 * CUDA 12+'s entry-point look-up, built on the layer's own look-ups so that every name the layer hooks
 * keeps its hook: the names this library supplies first (so cudart and Triton get them too), then the
 * layer's v2 when it has one, else its v1 (the status is derived from the pointer), else, for a layer
 * without any (built before CUDA 11.3), the layer's export of the exact versioned symbol the driver would
 * hand out (proc_versions.h); a symbol the layer lacks is not found, as on an older driver.
 */
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                                    cuuint64_t flags, int *status) {
    if (pfn == NULL || symbol == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int not_found = PROC_ADDRESS_SYMBOL_NOT_FOUND;
    const char *exact = versioned_symbol(symbol, cuda_version, flags, &not_found);
    void *own = NULL;
    if (exact != NULL)
        own = strcmp(exact, "cuGetProcAddress_v2") == 0 ? (void *)cuGetProcAddress_v2 : own_symbol(exact);
    if (own != NULL) {
        *pfn = own;
        if (status != NULL) *status = PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&resolve_lock);
    if (proc_address_source == SOURCE_UNRESOLVED && (proc_address_layer = layer_handle()) != NULL) {
        layer_v2 = (proc_address_v2_fn)dlsym(proc_address_layer, "cuGetProcAddress_v2");
        if (is_own_address((void *)layer_v2)) layer_v2 = NULL;
        layer_v1 = (proc_address_v1_fn)dlsym(proc_address_layer, "cuGetProcAddress");
        proc_address_source = layer_v2   ? SOURCE_LAYER_PROC_ADDRESS_V2
                              : layer_v1 ? SOURCE_LAYER_PROC_ADDRESS
                                         : SOURCE_LAYER_SYMBOL;
    }
    int source = proc_address_source;
    pthread_mutex_unlock(&resolve_lock);

    CUresult result;
    switch (source) {
    case SOURCE_LAYER_PROC_ADDRESS_V2:
        return layer_v2(symbol, pfn, cuda_version, flags, status);
    case SOURCE_LAYER_PROC_ADDRESS:
        result = layer_v1(symbol, pfn, cuda_version, flags);
        break;
    case SOURCE_LAYER_SYMBOL:
        *pfn = exact != NULL ? dlsym(proc_address_layer, exact) : NULL;
        result = *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
        break;
    default:
        return CUDA_ERROR_NOT_INITIALIZED; /* nothing loaded libcuda.so.1 yet */
    }
    if (status != NULL) *status = *pfn ? PROC_ADDRESS_SUCCESS : not_found;
    return result;
}

#endif /* TMAGUARD_PROC_ADDRESS_V2 */

/* Where `name` was resolved from (SOURCE_*); SOURCE_NONE for a name this library does not supply. */
EXPORT int tmaguard_shim_source(const char *name) {
    int source = SOURCE_NONE;
    pthread_mutex_lock(&resolve_lock);
#ifdef TMAGUARD_ENCODERS
#define SOURCE_OF(n, type, params, args, version)                                                \
    if (strcmp(name, #n) == 0) source = source_##n;
    ENCODERS(SOURCE_OF)
#endif
#ifdef TMAGUARD_PROC_ADDRESS_V2
    if (strcmp(name, "cuGetProcAddress_v2") == 0) source = proc_address_source;
#endif
#ifdef TMAGUARD_LAUNCH_EX
    if (strcmp(name, "cuLaunchKernelEx") == 0) source = launch_source;
#endif
    pthread_mutex_unlock(&resolve_lock);
    return source;
}

static int is_own_address(const void *fn) {
    if (fn == NULL) return 0;
#ifdef TMAGUARD_ENCODERS
#define IS_OWN(name, type, params, args, version)                                                \
    if (fn == (const void *)tmaguard_own_##name || fn == (const void *)resolve_##name ||          \
        fn == (const void *)unsupported_##name)                                                   \
        return 1;
    ENCODERS(IS_OWN)
#endif
#ifdef TMAGUARD_PROC_ADDRESS_V2
    if (fn == (const void *)cuGetProcAddress_v2) return 1;
#endif
#ifdef TMAGUARD_LAUNCH_EX
    if (fn == (const void *)cuLaunchKernelEx || fn == (const void *)cuLaunchKernelEx_ptsz) return 1;
#endif
    return 0;
}
