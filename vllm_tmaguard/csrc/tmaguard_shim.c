/*
 * Entry points a GPU-sharing layer's libcuda.so.1 lacks, forwarded to a real implementation.
 *
 * Compiled twice (see setup.py): with -DTMAGUARD_ENCODERS it exports the four tensor-map encoders, with
 * -DTMAGUARD_PROC_ADDRESS_V2 it exports cuGetProcAddress_v2. The guard loads only the library whose names
 * the layer lacks, RTLD_GLOBAL, before vLLM's first extension import, so that nothing the layer exports is
 * shadowed (a global-scope object loaded first wins every look-up of its names).
 *
 * Resolution happens once, on the first call, under a lock (CUDA is initialised by then; at load time the
 * layer may not even be mapped). Order (DESIGN.md §2.3, §2.4): the already-loaded layer's
 * cuGetProcAddress_v2, then its v1 cuGetProcAddress, then the real driver file, opened only while the
 * layer's libcuda.so.1 is mapped (RTLD_NOLOAD first). After that each call is one load and one indirect jump.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef uint64_t cuuint64_t;
typedef uint32_t cuuint32_t;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    PROC_ADDRESS_SUCCESS = 0,
    PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
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
    if (path == NULL) {
        real_driver_path[0] = '\0';
    } else {
        strncpy(real_driver_path, path, sizeof real_driver_path - 1);
        real_driver_path[sizeof real_driver_path - 1] = '\0';
    }
    pthread_mutex_unlock(&resolve_lock);
}

static int is_own_address(const void *fn);

/* The layer's libcuda.so.1, only if something already loaded it; never loads it (DESIGN.md §2.4). */
static void *mapped_layer(void) {
    return dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
}

#define LOAD(slot) __atomic_load_n(&(slot), __ATOMIC_ACQUIRE)
#define STORE(slot, value) __atomic_store_n(&(slot), (value), __ATOMIC_RELEASE)

#ifdef TMAGUARD_ENCODERS

/* Looks one driver entry point up through the layer, then the real driver file. Caller holds the lock. */
static void *find_real(void *layer, const char *name, int min_cuda_version, int *source) {
    void *fn = NULL;
    int status = PROC_ADDRESS_SYMBOL_NOT_FOUND;

    proc_address_v2_fn v2 = (proc_address_v2_fn)dlsym(layer, "cuGetProcAddress_v2");
    if (v2 != NULL && !is_own_address((void *)v2) &&
        v2(name, &fn, min_cuda_version, 0, &status) == CUDA_SUCCESS && fn != NULL &&
        status == PROC_ADDRESS_SUCCESS && !is_own_address(fn)) {
        *source = SOURCE_LAYER_PROC_ADDRESS_V2;
        return fn;
    }
    fn = NULL;
    proc_address_v1_fn v1 = (proc_address_v1_fn)dlsym(layer, "cuGetProcAddress");
    if (v1 != NULL && !is_own_address((void *)v1) &&
        v1(name, &fn, min_cuda_version, 0) == CUDA_SUCCESS && fn != NULL && !is_own_address(fn)) {
        *source = SOURCE_LAYER_PROC_ADDRESS;
        return fn;
    }
    if (real_driver_path[0] != '\0') {
        /* The layer opened the real driver itself in the usual case: reuse that copy. */
        void *real = dlopen(real_driver_path, RTLD_NOW | RTLD_NOLOAD);
        if (real == NULL) real = dlopen(real_driver_path, RTLD_NOW | RTLD_LOCAL);
        if (real != NULL && real != layer) {
            fn = dlsym(real, name);
            if (fn != NULL && !is_own_address(fn)) {
                *source = SOURCE_REAL_DRIVER;
                return fn;
            }
        }
    }
    *source = SOURCE_NONE;
    return NULL;
}

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

/* One X-macro row per encoder: name, function type, parameter list, argument list, CUDA version
   that introduced it (asked of cuGetProcAddress). */
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
#error "tmaguard shim: only x86-64 and aarch64 are supported"
#endif
ENCODERS(TRAMPOLINE)

static int resolve_encoders(void) {
    int ready = 1;
    pthread_mutex_lock(&resolve_lock);
    if (source_cuTensorMapEncodeTiled == SOURCE_UNRESOLVED) {
        void *layer = mapped_layer();
        if (layer == NULL) {
            ready = 0; /* no driver yet: no context can exist, try again on the next call */
        } else {
#define RESOLVE(name, type, params, args, version)                                               \
            {                                                                                     \
                type fn = (type)find_real(layer, #name, version, &source_##name);                 \
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

EXPORT int tmaguard_shim_source(const char *name) {
    pthread_mutex_lock(&resolve_lock);
    int source = SOURCE_NONE;
#define SOURCE_OF(n, type, params, args, version)                                                \
    if (strcmp(name, #n) == 0) source = source_##n;
    ENCODERS(SOURCE_OF)
    pthread_mutex_unlock(&resolve_lock);
    return source;
}

static int is_own_address(const void *fn) {
#define IS_OWN(name, type, params, args, version)                                                \
    if (fn == (const void *)tmaguard_own_##name || fn == (const void *)resolve_##name ||                         \
        fn == (const void *)unsupported_##name)                                                   \
        return 1;
    ENCODERS(IS_OWN)
    return 0;
}

#endif /* TMAGUARD_ENCODERS */

#ifdef TMAGUARD_PROC_ADDRESS_V2

static int proc_address_source = SOURCE_UNRESOLVED;
static void *layer_handle; /* kept open: libcuda.so.1 is never unloaded anyway */
static proc_address_v2_fn layer_v2;
static proc_address_v1_fn layer_v1;

/*
 * CUDA 12+'s entry-point look-up, built on the layer's own look-ups so that every name the layer hooks
 * keeps its hook: the layer's v2 when it has one, else its v1 (the status is derived from the pointer),
 * else a plain dlsym in the layer's handle.
 */
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                                    cuuint64_t flags, int *status) {
    if (pfn == NULL || symbol == NULL) return 1; /* CUDA_ERROR_INVALID_VALUE */
    pthread_mutex_lock(&resolve_lock);
    if (proc_address_source == SOURCE_UNRESOLVED && (layer_handle = mapped_layer()) != NULL) {
        layer_v2 = (proc_address_v2_fn)dlsym(layer_handle, "cuGetProcAddress_v2");
        if (is_own_address((void *)layer_v2)) layer_v2 = NULL;
        layer_v1 = (proc_address_v1_fn)dlsym(layer_handle, "cuGetProcAddress");
        proc_address_source = layer_v2   ? SOURCE_LAYER_PROC_ADDRESS_V2
                              : layer_v1 ? SOURCE_LAYER_PROC_ADDRESS
                                         : SOURCE_LAYER_SYMBOL;
    }
    int source = proc_address_source;
    pthread_mutex_unlock(&resolve_lock);

    *pfn = NULL;
    CUresult result;
    switch (source) {
    case SOURCE_LAYER_PROC_ADDRESS_V2:
        return layer_v2(symbol, pfn, cuda_version, flags, status);
    case SOURCE_LAYER_PROC_ADDRESS:
        result = layer_v1(symbol, pfn, cuda_version, flags);
        break;
    case SOURCE_LAYER_SYMBOL:
        *pfn = dlsym(layer_handle, symbol);
        result = *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
        break;
    default:
        return CUDA_ERROR_NOT_INITIALIZED; /* nothing loaded libcuda.so.1 yet */
    }
    if (status != NULL) *status = *pfn ? PROC_ADDRESS_SUCCESS : PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return result;
}

EXPORT int tmaguard_shim_source(const char *name) {
    if (strcmp(name, "cuGetProcAddress_v2") != 0) return SOURCE_NONE;
    pthread_mutex_lock(&resolve_lock);
    int source = proc_address_source;
    pthread_mutex_unlock(&resolve_lock);
    return source;
}

static int is_own_address(const void *fn) { return fn == (const void *)cuGetProcAddress_v2; }

#endif /* TMAGUARD_PROC_ADDRESS_V2 */
