/*
 * cuTensorMapEncodeTiled per call, one way per process (run interleaved by run.sh):
 *   direct   the real driver's own function
 *   shim     the guard's RTLD_GLOBAL encoder shim in front of the layer (the shim path)
 *   overlay  the guard's overlay libcuda.so.1 (the overlay path)
 * A context is made current first (the encoder needs one). Prints the median ns/call over REPEATS runs of
 * CALLS calls, and the encoder's result code.
 * usage: encode_bench MODE REAL_DRIVER [SHIM_OR_OVERLAY]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CALLS 1000000
#define REPEATS 15

typedef int (*init_fn)(unsigned);
typedef int (*device_get_fn)(int *, int);
typedef int (*retain_fn)(void **, int);
typedef int (*set_current_fn)(void *);
typedef int (*alloc_fn)(uint64_t *, size_t);
typedef int (*encode_fn)(void *, int, uint32_t, void *, const uint64_t *, const uint64_t *,
                         const uint32_t *, const uint32_t *, int, int, int, int);

static void *need(void *handle, const char *name) {
    void *fn = dlsym(handle, name);
    if (!fn) { fprintf(stderr, "missing %s: %s\n", name, dlerror()); exit(2); }
    return fn;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const char *mode = argv[1], *real = argv[2];
    void *driver, *encoder_lib;
    if (strcmp(mode, "direct") == 0) {
        driver = encoder_lib = dlopen(real, RTLD_NOW);
    } else if (strcmp(mode, "overlay") == 0) {
        encoder_lib = dlopen(argv[3], RTLD_NOW);          /* becomes this process's libcuda.so.1 */
        driver = dlopen("libcuda.so.1", RTLD_NOW);
        if (driver != encoder_lib) { fprintf(stderr, "overlay is not libcuda.so.1\n"); return 2; }
    } else {
        encoder_lib = dlopen(argv[3], RTLD_NOW | RTLD_GLOBAL);  /* the shim, before libcuda.so.1 */
        ((void (*)(const char *))need(encoder_lib, "tmaguard_shim_set_real_driver"))(real);
        driver = dlopen("libcuda.so.1", RTLD_NOW);          /* the layer, from LD_LIBRARY_PATH */
    }
    if (!driver || !encoder_lib) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    if (strcmp(mode, "overlay") == 0)
        ((void (*)(const char *))need(encoder_lib, "tmaguard_shim_set_real_driver"))(real);

    int device;
    void *context;
    uint64_t memory;
    if (((init_fn)need(driver, "cuInit"))(0) || ((device_get_fn)need(driver, "cuDeviceGet"))(&device, 0) ||
        ((retain_fn)need(driver, "cuDevicePrimaryCtxRetain"))(&context, device) ||
        ((set_current_fn)need(driver, "cuCtxSetCurrent"))(context) ||
        ((alloc_fn)need(driver, "cuMemAlloc_v2"))(&memory, 4096 * 4096 * 2)) {
        fprintf(stderr, "CUDA set-up failed\n");
        return 2;
    }
    encode_fn encode = (encode_fn)need(encoder_lib, "cuTensorMapEncodeTiled");
    uint64_t dims[2] = {4096, 4096}, strides[1] = {4096 * 2};
    uint32_t box[2] = {64, 64}, element_strides[2] = {1, 1};
    _Alignas(64) unsigned char map[128];
    /* fp16, no interleave, 128B swizzle, 128B L2 promotion, zero fill */
    int first = encode(map, 6, 2, (void *)(uintptr_t)memory, dims, strides, box, element_strides, 0, 3, 2, 0);
    double per_call[REPEATS];
    for (int r = 0; r < REPEATS; r++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < CALLS; i++)
            encode(map, 6, 2, (void *)(uintptr_t)memory, dims, strides, box, element_strides, 0, 3, 2, 0);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        per_call[r] = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / CALLS;
    }
    qsort(per_call, REPEATS, sizeof(double), cmp);
    printf("{\"mode\": \"%s\", \"result\": %d, \"median_ns\": %.3f, \"min_ns\": %.3f}\n", mode, first,
           per_call[REPEATS / 2], per_call[0]);
    return first != 0;
}
