/*
 * Shared X-macro lists of the CUDA driver entry points the stand-ins export.
 *
 * L = everything vLLM 0.32.0's extensions and torch 2.13's libraries reference
 * from libcuda.so.1 (plus a few classic ones). Every name must exist in a
 * libcuda.so.1 or dlopen(RTLD_NOW) of those extensions fails.
 *
 * X(name, out_arg, out_bytes): out_arg is the 0-based index of an out-pointer
 * the stand-in driver zero-fills (-1: none), out_bytes its size.
 */
#ifndef STANDIN_ENTRY_POINTS_H
#define STANDIN_ENTRY_POINTS_H

typedef int CUresult;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_STUB_LIBRARY 34
#define CUDA_ERROR_NOT_FOUND 500
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

/* Generic signature: integer/pointer arguments only, extra slots are ignored. */
#define STANDIN_GENERIC_PARAMS                                                 \
    void *a0, void *a1, void *a2, void *a3, void *a4, void *a5, void *a6,      \
        void *a7, void *a8, void *a9, void *a10, void *a11
#define STANDIN_GENERIC_ARGS a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11
typedef CUresult (*standin_generic_fn)(STANDIN_GENERIC_PARAMS);

/* L without the two error-string functions. */
#define STANDIN_GENERIC_EPS(X)                                                 \
    X(cuCtxGetCurrent, 0, 8)                                                   \
    X(cuCtxSetCurrent, -1, 0)                                                  \
    X(cuDeviceGetAttribute, 0, 4)                                              \
    X(cuDevicePrimaryCtxRetain, 0, 8)                                          \
    X(cuMemAddressFree, -1, 0)                                                 \
    X(cuMemAddressReserve, 0, 8)                                               \
    X(cuMemCreate, 0, 8)                                                       \
    X(cuMemGetAllocationGranularity, 0, 8)                                     \
    X(cuMemMap, -1, 0)                                                         \
    X(cuMemRelease, -1, 0)                                                     \
    X(cuMemSetAccess, -1, 0)                                                   \
    X(cuMemUnmap, -1, 0)                                                       \
    X(cuPointerGetAttribute, -1, 0)                                            \
    X(cuDeviceGet, 0, 4)                                                       \
    X(cuDevicePrimaryCtxGetState, 1, 4)                                        \
    X(cuFuncGetAttribute, 0, 4)                                                \
    X(cuFuncSetAttribute, -1, 0)                                               \
    X(cuFuncSetCacheConfig, -1, 0)                                             \
    X(cuLinkAddData_v2, -1, 0)                                                 \
    X(cuLinkComplete, 1, 8)                                                    \
    X(cuLinkCreate_v2, 3, 8)                                                   \
    X(cuModuleGetFunction, 0, 8)                                               \
    X(cuModuleLoad, 0, 8)                                                      \
    X(cuModuleLoadData, 0, 8)                                                  \
    X(cuModuleLoadDataEx, 0, 8)                                                \
    X(cuModuleUnload, -1, 0)                                                   \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, 0, 4)                       \
    X(cuMemFree_v2, -1, 0)                                                     \
    X(cuMemcpyHtoD_v2, -1, 0)                                                  \
    X(cuMemcpyDtoH_v2, -1, 0)                                                  \
    X(cuCtxCreate_v2, 0, 8)                                                    \
    X(cuCtxSynchronize, -1, 0)                                                 \
    X(cuDeviceGetName, 0, 1)                                                   \
    X(cuDeviceComputeCapability, 0, 4)

/* cuGetErrorString / cuGetErrorName(CUresult, const char **out). */
#define STANDIN_ERROR_EPS(X)                                                   \
    X(cuGetErrorString, -1, 0)                                                 \
    X(cuGetErrorName, -1, 0)

/* Part of L that a sharing layer meters (vCUDA hooks them: memory quota, SM limiter). */
#define STANDIN_METERED_EPS(X)                                                 \
    X(cuMemAlloc_v2, 0, 8)                                                     \
    X(cuMemGetInfo_v2, -1, 0)                                                  \
    X(cuDeviceTotalMem_v2, 0, 8)                                               \
    X(cuLaunchKernel, -1, 0)                                                   \
    X(cuLaunchCooperativeKernel, -1, 0)

/* The whole list L. */
#define STANDIN_L_EPS(X) STANDIN_GENERIC_EPS(X) STANDIN_METERED_EPS(X) STANDIN_ERROR_EPS(X)

/* Older ABIs and per-thread-default-stream variants a driver (and a layer built against CUDA 11 headers)
   exports beside L: the legacy cuMemAlloc of 32-bit device pointers, cuMemGetInfo, cuDeviceTotalMem. */
#define STANDIN_LEGACY_EPS(X)                                                  \
    X(cuMemAlloc, 0, 4)                                                        \
    X(cuMemGetInfo, -1, 0)                                                     \
    X(cuDeviceTotalMem, 0, 4)                                                  \
    X(cuLaunchKernel_ptsz, -1, 0)                                              \
    X(cuLaunchCooperativeKernel_ptsz, -1, 0)                                   \
    X(cuMemcpyAsync, -1, 0)                                                    \
    X(cuMemcpyAsync_ptsz, -1, 0)                                               \
    X(cuStreamWaitValue32, -1, 0)                                              \
    X(cuGetExportTable, 0, 8)

/* Entry points of the CUDA 12 runtime libraries (cuBLASLt loads kernels as libraries) that a layer built
   against CUDA 11 headers lacks. */
#define STANDIN_CUDA12_EPS(X)                                                  \
    X(cuLibraryLoadData, 0, 8)                                                 \
    X(cuLibraryGetKernel, 0, 8)                                                \
    X(cuKernelGetFunction, 0, 8)                                               \
    X(cuCtxCreate_v4, 0, 8)                                                    \
    X(cuStreamWaitValue32_v2, -1, 0)

/* Exported by every stand-in libcuda (driver and layers) beside L. */
#define STANDIN_BASIC_EPS(X)                                                   \
    X(cuInit, -1, 0)                                                           \
    X(cuDriverGetVersion, -1, 0)                                               \
    X(cuDeviceGetCount, -1, 0)

/* Newer entry points that upstream vCUDA lacks. */
#define STANDIN_ENCODER_EPS(X)                                                 \
    X(cuTensorMapEncodeTiled, -1, 0)                                           \
    X(cuTensorMapEncodeIm2col, -1, 0)                                          \
    X(cuTensorMapEncodeIm2colWide, -1, 0)                                      \
    X(cuTensorMapReplaceAddress, -1, 0)

#define STANDIN_NEW_EPS(X)                                                     \
    STANDIN_ENCODER_EPS(X)                                                     \
    X(cuGetProcAddress_v2, -1, 0)                                              \
    X(cuLaunchKernelEx, -1, 0)                                                 \
    X(cuLaunchKernelEx_ptsz, -1, 0)

/* Exact prototypes of the encoders (they take more than 12 arguments). */
typedef unsigned long long cuuint64_t;
typedef unsigned int cuuint32_t;

#define STANDIN_TILED_PARAMS                                                   \
    void *tensorMap, int dataType, cuuint32_t rank, void *globalAddress,       \
        const cuuint64_t *globalDim, const cuuint64_t *globalStrides,          \
        const cuuint32_t *boxDim, const cuuint32_t *elementStrides,            \
        int interleave, int swizzle, int l2Promotion, int oobFill
#define STANDIN_TILED_ARGS                                                     \
    tensorMap, dataType, rank, globalAddress, globalDim, globalStrides,        \
        boxDim, elementStrides, interleave, swizzle, l2Promotion, oobFill

#define STANDIN_IM2COL_PARAMS                                                  \
    void *tensorMap, int dataType, cuuint32_t rank, void *globalAddress,       \
        const cuuint64_t *globalDim, const cuuint64_t *globalStrides,          \
        const int *pixelBoxLowerCorner, const int *pixelBoxUpperCorner,        \
        cuuint32_t channelsPerPixel, cuuint32_t pixelsPerColumn,               \
        const cuuint32_t *elementStrides, int interleave, int swizzle,         \
        int l2Promotion, int oobFill
#define STANDIN_IM2COL_ARGS                                                    \
    tensorMap, dataType, rank, globalAddress, globalDim, globalStrides,        \
        pixelBoxLowerCorner, pixelBoxUpperCorner, channelsPerPixel,            \
        pixelsPerColumn, elementStrides, interleave, swizzle, l2Promotion,     \
        oobFill

#define STANDIN_IM2COL_WIDE_PARAMS                                             \
    void *tensorMap, int dataType, cuuint32_t rank, void *globalAddress,       \
        const cuuint64_t *globalDim, const cuuint64_t *globalStrides,          \
        int pixelBoxLowerCornerWidth, int pixelBoxUpperCornerWidth,            \
        cuuint32_t channelsPerPixel, cuuint32_t pixelsPerColumn,               \
        const cuuint32_t *elementStrides, int interleave, int mode,            \
        int swizzle, int l2Promotion, int oobFill
#define STANDIN_IM2COL_WIDE_ARGS                                               \
    tensorMap, dataType, rank, globalAddress, globalDim, globalStrides,        \
        pixelBoxLowerCornerWidth, pixelBoxUpperCornerWidth, channelsPerPixel,  \
        pixelsPerColumn, elementStrides, interleave, mode, swizzle,            \
        l2Promotion, oobFill

#define STANDIN_REPLACE_PARAMS void *tensorMap, void *globalAddress
#define STANDIN_REPLACE_ARGS tensorMap, globalAddress

typedef CUresult (*standin_tiled_fn)(STANDIN_TILED_PARAMS);
typedef CUresult (*standin_im2col_fn)(STANDIN_IM2COL_PARAMS);
typedef CUresult (*standin_im2col_wide_fn)(STANDIN_IM2COL_WIDE_PARAMS);
typedef CUresult (*standin_replace_fn)(STANDIN_REPLACE_PARAMS);
typedef CUresult (*standin_gpa_fn)(const char *, void **, int,
                                   unsigned long long);
typedef CUresult (*standin_gpa2_fn)(const char *, void **, int,
                                    unsigned long long, int *);

#define STANDIN_EXPORT __attribute__((visibility("default")))

#endif
