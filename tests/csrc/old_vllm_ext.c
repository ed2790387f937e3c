/*
 * Emulates vLLM 0.6's vllm/_C.abi3.so: a CPython extension that carries
 * NEEDED libcuda.so.1 and an undefined cuTensorMapEncodeTiled, so importing
 * it fails with "undefined symbol" where libcuda.so.1 lacks the encoder.
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x03080000
#include <Python.h>

typedef int CUresult;

extern CUresult cuTensorMapEncodeTiled(void *tensorMap, int dataType, unsigned rank,
                                       void *globalAddress,
                                       const unsigned long long *globalDim,
                                       const unsigned long long *globalStrides,
                                       const unsigned *boxDim,
                                       const unsigned *elementStrides, int interleave,
                                       int swizzle, int l2Promotion, int oobFill);

extern CUresult cuInit(unsigned flags);

/* encode_probe() -> (descriptor: bytes[128], result: int); after cuInit, as in any CUDA program. */
static PyObject *encode_probe(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    unsigned char desc[128] __attribute__((aligned(64)));
    memset(desc, 0, sizeof(desc));
    unsigned long long dims[1] = {4096};
    unsigned long long strides[1] = {8192};
    unsigned box[1] = {64};
    unsigned element_strides[1] = {1};
    CUresult r = cuInit(0);
    if (r == 0)
        r = cuTensorMapEncodeTiled(desc, 7, 1, (void *)0x1000, dims, strides, box,
                                        element_strides, 0, 0, 0, 0);
    return Py_BuildValue("(y#i)", (const char *)desc, (Py_ssize_t)sizeof(desc), (int)r);
}

static PyMethodDef methods[] = {
    {"encode_probe", encode_probe, METH_NOARGS, "Encode a descriptor via libcuda."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_C", "vLLM 0.6 _C stand-in", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
