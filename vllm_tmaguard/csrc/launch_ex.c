/*
 * cuLaunchKernelEx (CUDA 12) for a layer that lacks it: translated to the layer's metered cuLaunchKernel (or
 * its cooperative launch) wherever the launch attributes allow, so that the layer's SM limiter still sees
 * the launch; launches whose attributes cuLaunchKernel cannot carry (clusters, programmatic serialization)
 * go to the real driver's cuLaunchKernelEx and are counted as unmetered (docs/design.md §2.4). Triton calls
 * it for every launch.
 */
#include "tmaguard.h"

#include <dlfcn.h>
#include <string.h>

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

enum { VIA_LAUNCH, VIA_COOPERATIVE, VIA_REAL_EX };

typedef CUresult (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, void *, void **, void **);
typedef CUresult (*cooperative_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, void *, void **);
typedef CUresult (*launch_ex_fn)(const launch_config *, void *, void **, void **);

/* For legacy-stream [0] and per-thread-default-stream [1] callers (a NULL stream in cuLaunchKernelEx_ptsz
   is the calling thread's default stream). Resolved at the first launch; the real driver's part at the
   first launch that needs it. */
static const char *const launch_names[2] = {"cuLaunchKernel", "cuLaunchKernel_ptsz"};
static const char *const cooperative_names[2] = {"cuLaunchCooperativeKernel",
                                                 "cuLaunchCooperativeKernel_ptsz"};
static const char *const launch_ex_names[2] = {"cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"};
static launch_fn layer_launch[2];
static cooperative_fn layer_cooperative[2];
static launch_ex_fn real_launch_ex[2];
static long long launch_counts[3]; /* via cuLaunchKernel, via the cooperative call, unmetered */

#define LOAD(slot) __atomic_load_n(&(slot), __ATOMIC_ACQUIRE)
#define STORE(slot, value) __atomic_store_n(&(slot), (value), __ATOMIC_RELEASE)

/* Which call expresses this launch. */
static int classify(const launch_config *config) {
    int via = VIA_LAUNCH;
    for (unsigned i = 0; i < config->num_attrs; i++) {
        const launch_attribute *attr = &config->attrs[i];
        switch (attr->id) {
        case ATTR_IGNORE:
            break;
        case ATTR_COOPERATIVE:
            via = attr->value.integer != 0 ? VIA_COOPERATIVE : VIA_LAUNCH;
            break;
        case ATTR_CLUSTER_DIMENSION:
            if (attr->value.cluster.x > 1 || attr->value.cluster.y > 1 || attr->value.cluster.z > 1)
                return VIA_REAL_EX;
            break;
        case ATTR_CLUSTER_SCHEDULING_POLICY:
        case ATTR_PROGRAMMATIC_STREAM_SERIALIZATION:
            if (attr->value.integer != 0) return VIA_REAL_EX;
            break;
        default:
            return VIA_REAL_EX;
        }
    }
    return via;
}

static CUresult launch_ex(int per_thread, const launch_config *config, void *function, void **params,
                          void **extra) {
    if (config == NULL || (config->num_attrs > 0 && config->attrs == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    launch_fn launch = LOAD(layer_launch[per_thread]);
    if (launch == NULL) {
        launch = (launch_fn)tmaguard_layer_symbol(launch_names[per_thread]);
        STORE(layer_cooperative[per_thread],
              (cooperative_fn)tmaguard_layer_symbol(cooperative_names[per_thread]));
        STORE(layer_launch[per_thread], launch);
    }
    cooperative_fn cooperative = LOAD(layer_cooperative[per_thread]);
    int via = classify(config);
    if (via == VIA_COOPERATIVE && (cooperative == NULL || extra != NULL)) via = VIA_REAL_EX;
    if (via == VIA_LAUNCH && launch == NULL) via = VIA_REAL_EX;
    __atomic_fetch_add(&launch_counts[via], 1, __ATOMIC_RELAXED);
    switch (via) {
    case VIA_LAUNCH:
        return launch(function, config->grid_x, config->grid_y, config->grid_z, config->block_x,
                      config->block_y, config->block_z, config->shared_bytes, config->stream, params,
                      extra);
    case VIA_COOPERATIVE:
        return cooperative(function, config->grid_x, config->grid_y, config->grid_z, config->block_x,
                           config->block_y, config->block_z, config->shared_bytes, config->stream,
                           params);
    default: {
        launch_ex_fn real = LOAD(real_launch_ex[per_thread]);
        if (real == NULL) {
            void *driver = tmaguard_real_driver();
            if (driver == NULL) return CUDA_ERROR_NOT_INITIALIZED;
            real = (launch_ex_fn)dlsym(driver, launch_ex_names[per_thread]);
            if (real == NULL || tmaguard_is_own((void *)real)) return CUDA_ERROR_NOT_SUPPORTED;
            STORE(real_launch_ex[per_thread], real);
        }
        return real(config, function, params, extra);
    }
    }
}

static CUresult own_launch_ex(const launch_config *config, void *function, void **params, void **extra) {
    return launch_ex(0, config, function, params, extra);
}

static CUresult own_launch_ex_ptsz(const launch_config *config, void *function, void **params,
                                   void **extra) {
    return launch_ex(1, config, function, params, extra);
}

void *tmaguard_own_launch(const char *symbol) {
    if (strcmp(symbol, launch_ex_names[0]) == 0) return (void *)own_launch_ex;
    if (strcmp(symbol, launch_ex_names[1]) == 0) return (void *)own_launch_ex_ptsz;
    return NULL;
}

/* Launches so far: through the layer's cuLaunchKernel, its cooperative launch, and unmetered (forwarded to
   the real driver's cuLaunchKernelEx because cuLaunchKernel cannot carry their attributes). */
EXPORT void tmaguard_launch_counts(long long out[3]) {
    for (int i = 0; i < 3; i++) out[i] = __atomic_load_n(&launch_counts[i], __ATOMIC_RELAXED);
}
