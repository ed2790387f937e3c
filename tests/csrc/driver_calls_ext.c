/*
 * A CPython extension that calls CUDA driver entry points through its own relocations, the way vLLM's
 * extensions do (NEEDED libcuda.so.1, U cu*). Loaded after the guard, it shows where each name binds:
 * the shim for the names the layer lacks, the layer for every other one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;
CUresult cuTensorMapEncodeTiled(void *, int, uint32_t, void *, const uint64_t *, const uint64_t *,
                                const uint32_t *, const uint32_t *, int, int, int, int);
CUresult cuMemAlloc_v2(uint64_t *, size_t);
CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        void *, void **, void **);
CUresult cuPointerGetAttribute(void *, int, uint64_t);
CUresult cuGetProcAddress_v2(const char *, void **, int, uint64_t, int *);
CUresult cuInit(unsigned);

/* What every CUDA program does first (torch has, by the time vLLM's kernels run). */
static PyObject *init(PyObject *self, PyObject *unused) { return Py_BuildValue("i", cuInit(0)); }

static PyObject *encode_tiled(PyObject *self, PyObject *args) {
    unsigned long long address = 0x1000, dim = 4096, stride = 8192;
    unsigned box = 64, element_stride = 1;
    if (!PyArg_ParseTuple(args, "|KK", &address, &dim)) return NULL;
    unsigned char map[128];
    memset(map, 0xEE, sizeof map);
    uint64_t dims[1] = {dim}, strides[1] = {stride};
    uint32_t boxes[1] = {box}, estrides[1] = {element_stride};
    CUresult r = cuTensorMapEncodeTiled(map, 7, 1, (void *)(uintptr_t)address, dims, strides, boxes,
                                        estrides, 0, 0, 0, 0);
    return Py_BuildValue("(iy#)", r, (const char *)map, (Py_ssize_t)sizeof map);
}

static PyObject *metered_calls(PyObject *self, PyObject *unused) {
    uint64_t pointer = 0;
    CUresult a = cuMemAlloc_v2(&pointer, 1 << 20);
    CUresult b = cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    CUresult c = cuPointerGetAttribute(&pointer, 1, pointer);
    return Py_BuildValue("(iii)", a, b, c);
}

/* Looks cuMemAlloc up through cuGetProcAddress_v2 as CUDA runtime 12+ does (the base name and the CUDA
   version it was built for: the driver hands out cuMemAlloc_v2), calls it. */
static PyObject *alloc_through_proc_address(PyObject *self, PyObject *unused) {
    void *fn = NULL;
    int status = -1;
    CUresult r = cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 0, &status);
    if (r != 0 || fn == NULL) return Py_BuildValue("(iiO)", r, status, Py_None);
    uint64_t pointer = 0;
    CUresult a = ((CUresult(*)(uint64_t *, size_t))fn)(&pointer, 4096);
    return Py_BuildValue("(iii)", r, status, a);
}

static PyMethodDef methods[] = {
    {"init", init, METH_NOARGS, "cuInit(0)"},
    {"encode_tiled", encode_tiled, METH_VARARGS, "cuTensorMapEncodeTiled -> (result, 128 bytes)"},
    {"metered_calls", metered_calls, METH_NOARGS, "cuMemAlloc_v2, cuLaunchKernel, cuPointerGetAttribute"},
    {"alloc_through_proc_address", alloc_through_proc_address, METH_NOARGS, "v2 look-up, then call"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "driver_calls", NULL, -1, methods};

PyMODINIT_FUNC PyInit_driver_calls(void) { return PyModule_Create(&module); }
