/*
 * Shared by the feature groups of the libraries this package builds (setup.py):
 *   overlay   SONAME libcuda.so.1, DT_NEEDED on the layer's file (a placeholder the guard patches), loaded
 *             before anything else loads libcuda.so.1: entry_points.c (every driver symbol of the CUDA 13
 *             headers), proc_address.c, launch_ex.c.
 *   encoders  shim loaded RTLD_GLOBAL where libcuda.so.1 was loaded first: entry_points.c, encoders only.
 *   proc-address  shim, likewise: proc_address.c.
 * Where a call ends up (docs/design.md §2.4-§2.6): the layer's own export of the exact symbol wherever it
 * has one (metered); else this library's own implementation (cuGetProcAddress_v2, cuLaunchKernelEx); else
 * the real driver the layer itself loaded (found among the process's loaded objects: its context is the
 * live one). Nothing here calls into the layer to find things out, and nothing is resolved before the
 * layer has loaded its real driver: until then such a call returns CUDA_ERROR_NOT_INITIALIZED, as the
 * driver does before cuInit.
 */
#ifndef TMAGUARD_H
#define TMAGUARD_H

#define _GNU_SOURCE
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))

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

/* Where a name was resolved from: tmaguard_shim_source() answers with these (the guard's tests and the
   doctor read them). */
enum {
    SOURCE_NONE = -1,       /* not one of this library's names, or resolved to "not found" */
    SOURCE_UNRESOLVED = 0,  /* not called or looked up yet, or no real driver loaded yet */
    SOURCE_REAL_DRIVER = 3, /* the real driver the layer loaded */
    SOURCE_LAYER_SYMBOL = 4, /* the layer's own export of the exact symbol */
    SOURCE_OWN = 5,          /* this library's implementation (cuGetProcAddress_v2, cuLaunchKernelEx) */
};

/* The layer: the overlay's DT_NEEDED file, or (shims) whatever answers libcuda.so.1. NULL until loaded. */
HIDDEN void *tmaguard_layer(void);
/* The real driver the layer loaded (RTLD_LOCAL, by its own name): a loaded libcuda.so* that is neither the
   layer nor one of ours; NULL until the layer has loaded one. Never loads anything. */
HIDDEN void *tmaguard_real_driver(void);
/* The layer's own export of `symbol`, never one of ours; NULL if the layer lacks it. */
HIDDEN void *tmaguard_layer_symbol(const char *symbol);
/* Whether the layer is a vCUDA build (tkestack's vcuda-controller and its forks): SONAME libcuda-control.so,
   or it exports g_vcuda_config. Its cuGetProcAddress(_v2) asks the real driver, then swaps in its own hook by
   the requested base name, whatever ABI was asked (docs/design.md §2.4). Reads the layer's dynamic section
   and symbol table only: never calls into it. */
HIDDEN int tmaguard_layer_is_vcuda(void);
/* Whether `address` lies in this library. */
HIDDEN int tmaguard_is_own(const void *address);
/* TMAGUARD_TRACE=1: one line on stderr per look-up and resolution (for a failed pod's diagnosis). */
HIDDEN int tmaguard_tracing(void);
HIDDEN void tmaguard_trace(const char *format, ...) __attribute__((format(printf, 1, 2)));

/* Generic CUresult stand-ins any entry point may jump to: every driver entry point returns a CUresult,
   and its caller cleans up its own arguments. */
HIDDEN CUresult tmaguard_not_initialized(void);
HIDDEN CUresult tmaguard_not_found(void);

#ifdef TMAGUARD_OVERLAY
/* entry_points.c: what a caller of the exact exported `symbol` should call now: the resolved function, or
   the trampoline while resolution must wait; NULL if `symbol` is not in the catalogue or not found. */
HIDDEN void *tmaguard_entry_point(const char *symbol, int *source);
/* proc_address.c and launch_ex.c: this library's own implementation of `symbol`, used where the layer
   lacks it; NULL for every other name. */
HIDDEN void *tmaguard_own_proc_address(const char *symbol);
HIDDEN void *tmaguard_own_launch(const char *symbol);
#endif

#endif
