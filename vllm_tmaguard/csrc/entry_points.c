/*
 * Exported driver entry points as trampolines: each is one load of its slot and one indirect jump, whatever
 * its arity. A slot first holds a stub that resolves the name on its first call (tmaguard.h's order: the
 * layer's export, this library's own implementation, the real driver the layer loaded) and stores the
 * answer; until the layer has loaded its real driver, a name it lacks answers CUDA_ERROR_NOT_INITIALIZED
 * and is resolved again on the next call.
 *   overlay: every symbol of the CUDA 13 headers (driver_symbols.h), so that handle-scoped look-ups
 *            (cudart, cuBLASLt's raw table, Triton) find each name, the layer's own where it has one.
 *   encoders shim: the four tensor-map encoders.
 */
#include "tmaguard.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#ifdef TMAGUARD_OVERLAY
#include "driver_symbols.h"
#define ENTRY_LIST DRIVER_SYMBOLS
#define ENTRY_COUNT DRIVER_SYMBOL_COUNT
#else
/* Sorted as strcmp orders them (bsearch). */
#define ENTRY_LIST(X)                                                                              \
    X(0, cuTensorMapEncodeIm2col)                                                                  \
    X(1, cuTensorMapEncodeIm2colWide)                                                              \
    X(2, cuTensorMapEncodeTiled)                                                                   \
    X(3, cuTensorMapReplaceAddress)
#define ENTRY_COUNT 4
#endif

#define LOAD(slot) __atomic_load_n(&(slot), __ATOMIC_ACQUIRE)
#define STORE(slot, value) __atomic_store_n(&(slot), (value), __ATOMIC_RELEASE)

/* Hidden labels of each trampoline and its stub (the exported names could be interposed). */
#define DECLARE_LABELS(index, name) extern HIDDEN char tmaguard_entry_##index[], tmaguard_stub_##index[];
ENTRY_LIST(DECLARE_LABELS)

static const char *const entry_names[ENTRY_COUNT] = {
#define NAME(index, name) [index] = #name,
    ENTRY_LIST(NAME)};

/* Read by the trampolines below (asm). */
HIDDEN void *tmaguard_slots[ENTRY_COUNT] = {
#define STUB(index, name) [index] = tmaguard_stub_##index,
    ENTRY_LIST(STUB)};

static int entry_sources[ENTRY_COUNT]; /* SOURCE_UNRESOLVED until the slot holds its answer */

#ifdef TMAGUARD_OVERLAY
static void *const trampolines[ENTRY_COUNT] = {
#define ENTRY(index, name) [index] = tmaguard_entry_##index,
    ENTRY_LIST(ENTRY)};
#endif

#if defined(__x86_64__)
#define TRAMPOLINE(index, name)                                                                    \
    __asm__(".text\n.globl " #name "\n.type " #name ",@function\n.p2align 4\n" #name ":\n"       \
            ".hidden tmaguard_entry_" #index "\ntmaguard_entry_" #index ":\n"                       \
            "\tjmp *tmaguard_slots+8*" #index "(%rip)\n.size " #name ", .-" #name "\n"             \
            ".hidden tmaguard_stub_" #index "\n.type tmaguard_stub_" #index ",@function\n"        \
            "tmaguard_stub_" #index ":\n\tmovl $" #index ", %r11d\n\tjmp tmaguard_lazy_common\n"   \
            ".size tmaguard_stub_" #index ", .-tmaguard_stub_" #index "\n");
/* r11 = the entry's index. Saves the argument registers (integer and vector; rax for variadic callers),
   asks tmaguard_resolve_slot where to go, restores them and jumps there with the caller's stack intact. */
__asm__(".text\n.hidden tmaguard_lazy_common\n.type tmaguard_lazy_common,@function\n.p2align 4\n"
        "tmaguard_lazy_common:\n"
        "\tpush %rbp\n\tmov %rsp, %rbp\n"
        "\tpush %rdi\n\tpush %rsi\n\tpush %rdx\n\tpush %rcx\n\tpush %r8\n\tpush %r9\n\tpush %rax\n"
        "\tsub $136, %rsp\n"
        "\tmovdqu %xmm0, 0(%rsp)\n\tmovdqu %xmm1, 16(%rsp)\n\tmovdqu %xmm2, 32(%rsp)\n"
        "\tmovdqu %xmm3, 48(%rsp)\n\tmovdqu %xmm4, 64(%rsp)\n\tmovdqu %xmm5, 80(%rsp)\n"
        "\tmovdqu %xmm6, 96(%rsp)\n\tmovdqu %xmm7, 112(%rsp)\n"
        "\tmovl %r11d, %edi\n\tcall tmaguard_resolve_slot\n\tmov %rax, %r11\n"
        "\tmovdqu 0(%rsp), %xmm0\n\tmovdqu 16(%rsp), %xmm1\n\tmovdqu 32(%rsp), %xmm2\n"
        "\tmovdqu 48(%rsp), %xmm3\n\tmovdqu 64(%rsp), %xmm4\n\tmovdqu 80(%rsp), %xmm5\n"
        "\tmovdqu 96(%rsp), %xmm6\n\tmovdqu 112(%rsp), %xmm7\n"
        "\tadd $136, %rsp\n"
        "\tpop %rax\n\tpop %r9\n\tpop %r8\n\tpop %rcx\n\tpop %rdx\n\tpop %rsi\n\tpop %rdi\n"
        "\tpop %rbp\n\tjmp *%r11\n"
        ".size tmaguard_lazy_common, .-tmaguard_lazy_common\n");
#elif defined(__aarch64__)
#define TRAMPOLINE(index, name)                                                                    \
    __asm__(".text\n.globl " #name "\n.type " #name ",%function\n.p2align 4\n" #name ":\n"       \
            ".hidden tmaguard_entry_" #index "\ntmaguard_entry_" #index ":\n"                       \
            "\tadrp x16, tmaguard_slots+8*" #index "\n"                                            \
            "\tldr x16, [x16, #:lo12:tmaguard_slots+8*" #index "]\n\tbr x16\n"                     \
            ".size " #name ", .-" #name "\n"                                                       \
            ".hidden tmaguard_stub_" #index "\n.type tmaguard_stub_" #index ",%function\n"        \
            "tmaguard_stub_" #index ":\n\tmov w17, #" #index "\n\tb tmaguard_lazy_common\n"       \
            ".size tmaguard_stub_" #index ", .-tmaguard_stub_" #index "\n");
/* w17 = the entry's index; x0-x8 and q0-q7 saved around the call, x30 restored before the jump. */
__asm__(".text\n.hidden tmaguard_lazy_common\n.type tmaguard_lazy_common,%function\n.p2align 4\n"
        "tmaguard_lazy_common:\n"
        "\tstp x29, x30, [sp, #-224]!\n\tmov x29, sp\n"
        "\tstp x0, x1, [sp, #16]\n\tstp x2, x3, [sp, #32]\n\tstp x4, x5, [sp, #48]\n"
        "\tstp x6, x7, [sp, #64]\n\tstr x8, [sp, #80]\n"
        "\tstp q0, q1, [sp, #96]\n\tstp q2, q3, [sp, #128]\n\tstp q4, q5, [sp, #160]\n"
        "\tstp q6, q7, [sp, #192]\n"
        "\tmov w0, w17\n\tbl tmaguard_resolve_slot\n\tmov x16, x0\n"
        "\tldp q0, q1, [sp, #96]\n\tldp q2, q3, [sp, #128]\n\tldp q4, q5, [sp, #160]\n"
        "\tldp q6, q7, [sp, #192]\n"
        "\tldp x0, x1, [sp, #16]\n\tldp x2, x3, [sp, #32]\n\tldp x4, x5, [sp, #48]\n"
        "\tldp x6, x7, [sp, #64]\n\tldr x8, [sp, #80]\n"
        "\tldp x29, x30, [sp], #224\n\tbr x16\n"
        ".size tmaguard_lazy_common, .-tmaguard_lazy_common\n");
#else
#error "tmaguard: only x86-64 and aarch64 are supported"
#endif
ENTRY_LIST(TRAMPOLINE)

/* The layer's init entry points: every other export of a vCUDA-like layer jumps through a table that only
   these fill (a call before them is a call through NULL). */
static int is_layer_init(const char *name) {
    return strcmp(name, "cuInit") == 0 || strcmp(name, "cuDriverGetVersion") == 0;
}

/* Before anything else of the layer's is handed out or called: its init, through its cuDriverGetVersion
   (which a real driver answers before cuInit too), unless the layer has already loaded its real driver.
   Once per process. */
static void ensure_layer_init(void) {
    static int done;
    if (__atomic_load_n(&done, __ATOMIC_ACQUIRE)) return;
    if (tmaguard_real_driver() == NULL) {
        CUresult (*driver_version)(int *) =
            (CUresult(*)(int *))tmaguard_layer_symbol("cuDriverGetVersion");
        int version = 0;
        if (driver_version != NULL) {
            CUresult result = driver_version(&version);
            tmaguard_trace("ran the layer's init (its cuDriverGetVersion: %d, %d)", result, version);
        }
    }
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
}

/* The function `entry_names[index]` should run now, and where it comes from; NULL while it must wait for
   the layer to load its real driver. */
static void *resolve(unsigned index, int *source) {
    const char *name = entry_names[index];
    void *fn;
#ifdef TMAGUARD_OVERLAY
    if ((fn = tmaguard_own_proc_address(name)) != NULL) { /* replaces even the layer's v1 look-up */
        *source = SOURCE_OWN;
        return fn;
    }
#endif
    if ((fn = tmaguard_layer_symbol(name)) != NULL) {
        if (!is_layer_init(name)) ensure_layer_init();
        *source = SOURCE_LAYER_SYMBOL;
        return fn;
    }
#ifdef TMAGUARD_OVERLAY
    if ((fn = tmaguard_own_launch(name)) != NULL) {
        *source = SOURCE_OWN;
        return fn;
    }
#endif
    void *real = tmaguard_real_driver();
    if (real == NULL) return NULL;
    fn = dlsym(real, name);
    if (fn == NULL || tmaguard_is_own(fn)) {
        *source = SOURCE_NONE;
        return (void *)tmaguard_not_found;
    }
    *source = SOURCE_REAL_DRIVER;
    return fn;
}

static const char *source_name(int source) {
    switch (source) {
    case SOURCE_LAYER_SYMBOL:
        return "the layer's export";
    case SOURCE_OWN:
        return "tmaguard's own";
    case SOURCE_REAL_DRIVER:
        return "the real driver";
    default:
        return "not found";
    }
}

/* Resolves slot `index` if it is not yet; returns its function, or NULL while resolution must wait. */
static void *settle(unsigned index) {
    if (LOAD(entry_sources[index]) != SOURCE_UNRESOLVED) return LOAD(tmaguard_slots[index]);
    int source = SOURCE_NONE;
    void *fn = resolve(index, &source);
    if (fn == NULL) return NULL;
    STORE(tmaguard_slots[index], fn);
    STORE(entry_sources[index], source);
    tmaguard_trace("%s -> %s", entry_names[index], source_name(source));
    return fn;
}

/* Called by tmaguard_lazy_common with the arguments of the original call saved. */
HIDDEN void *tmaguard_resolve_slot(unsigned index) {
    void *fn = settle(index);
    if (fn == NULL) {
        tmaguard_trace("%s called before the layer loaded a real driver: CUDA_ERROR_NOT_INITIALIZED",
                       entry_names[index]);
        return (void *)tmaguard_not_initialized;
    }
    return fn;
}

static int by_name(const void *key, const void *entry) { return strcmp(key, *(const char *const *)entry); }

static int index_of(const char *name) {
    const char *const *hit = bsearch(name, entry_names, ENTRY_COUNT, sizeof entry_names[0], by_name);
    return hit == NULL ? -1 : (int)(hit - entry_names);
}

int tmaguard_entry_source(const char *name) {
    int index = index_of(name);
    return index < 0 ? SOURCE_NONE : LOAD(entry_sources[index]);
}

#ifdef TMAGUARD_OVERLAY
void *tmaguard_entry_point(const char *symbol, int *source) {
    int index = index_of(symbol);
    if (index < 0) return NULL;
    void *fn = settle((unsigned)index);
    if (fn == NULL) { /* the trampoline resolves it once the layer has loaded its real driver */
        *source = SOURCE_UNRESOLVED;
        return trampolines[index];
    }
    *source = LOAD(entry_sources[index]);
    return *source == SOURCE_NONE ? NULL : fn;
}
#endif
