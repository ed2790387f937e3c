/* What every library of this package shares: the layer, the real driver behind it, tracing, and the
   marker the guard recognises its own libraries by (tmaguard_shim_source). See tmaguard.h. */
#include "tmaguard.h"

#include <dlfcn.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Resolution is idempotent and lock-free: the loader's own lock is taken inside dlopen/dlsym, and a lock of
   ours around those calls could deadlock against a thread that calls a driver entry point while holding
   the loader's lock (a library constructor). Two threads may both resolve a name; both store the same. */
#define LOAD(slot) __atomic_load_n(&(slot), __ATOMIC_ACQUIRE)
#define STORE(slot, value) __atomic_store_n(&(slot), (value), __ATOMIC_RELEASE)

static void *layer;
static void *real_driver;

#ifdef TMAGUARD_OVERLAY
/* Patched by the guard with the layer's absolute path, as is the identical DT_NEEDED string (setup.py). */
static const char layer_path[] = TMAGUARD_LAYER_PLACEHOLDER;
#define LAYER_NAME layer_path
#else
#define LAYER_NAME "libcuda.so.1" /* only if something already loaded it: never loads it (§2.5) */
#endif

void *tmaguard_layer(void) {
    void *handle = LOAD(layer);
    if (handle == NULL && (handle = dlopen(LAYER_NAME, RTLD_NOW | RTLD_NOLOAD)) != NULL)
        STORE(layer, handle); /* never closed: libcuda.so.1 is never unloaded */
    return handle;
}

/* The SONAME in a loaded object's dynamic section; NULL if it has none. The loader relocates the string
   table's address in place on x86-64 and aarch64; an address below the load base is taken as unrelocated. */
static const char *soname_of(void *handle) {
    struct link_map *map = NULL;
    if (handle == NULL || dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == NULL || map->l_ld == NULL)
        return NULL;
    const char *strings = NULL;
    long soname = -1;
    for (const ElfW(Dyn) *entry = map->l_ld; entry->d_tag != DT_NULL; entry++) {
        if (entry->d_tag == DT_STRTAB)
            strings = (const char *)entry->d_un.d_ptr;
        else if (entry->d_tag == DT_SONAME)
            soname = (long)entry->d_un.d_val;
    }
    if (strings == NULL || soname < 0)
        return NULL;
    if ((ElfW(Addr))strings < map->l_addr)
        strings += map->l_addr;
    return strings + soname;
}

int tmaguard_layer_is_vcuda(void) {
    static int answer = -1; /* -1: not asked yet */
    int value = LOAD(answer);
    if (value >= 0) return value;
    void *handle = tmaguard_layer();
    if (handle == NULL) return 0; /* asked again once the layer is loaded */
    const char *soname = soname_of(handle);
    value = (soname != NULL && strcmp(soname, "libcuda-control.so") == 0) ||
            tmaguard_layer_symbol("g_vcuda_config") != NULL;
    STORE(answer, value);
    return value;
}

int tmaguard_is_own(const void *address) {
    Dl_info found, own;
    return address != NULL && dladdr(address, &found) && dladdr((const void *)tmaguard_is_own, &own) &&
           found.dli_fbase == own.dli_fbase;
}

void *tmaguard_layer_symbol(const char *symbol) {
    void *handle = tmaguard_layer();
    void *fn = handle != NULL ? dlsym(handle, symbol) : NULL;
    return tmaguard_is_own(fn) ? NULL : fn;
}

#define MAX_LOADED 32

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

/* dlopen is not called from inside dl_iterate_phdr's callback: the loader's lock is held there. */
void *tmaguard_real_driver(void) {
    void *found_handle = LOAD(real_driver);
    if (found_handle != NULL) return found_handle;
    void *layer_handle = tmaguard_layer();
    struct loaded_names *found = calloc(1, sizeof *found);
    if (found == NULL) return NULL;
    dl_iterate_phdr(collect_driver_file, found);
    for (int i = 0; i < found->count && found_handle == NULL; i++) {
        void *handle = dlopen(found->names[i], RTLD_NOW | RTLD_NOLOAD);
        if (handle == NULL) continue;
        void *probe = dlsym(handle, "cuDriverGetVersion");
        if (handle != layer_handle && probe != NULL && !tmaguard_is_own(probe) &&
            dlsym(handle, "tmaguard_shim_source") == NULL)
            found_handle = handle; /* kept open: the layer opened it RTLD_NODELETE anyway */
        else
            dlclose(handle);
    }
    free(found);
    if (found_handle != NULL) {
        STORE(real_driver, found_handle);
        tmaguard_trace("the real driver the layer loaded is in use");
    }
    return found_handle;
}

int tmaguard_tracing(void) {
    static int tracing = -1;
    int value = LOAD(tracing);
    if (value < 0) {
        const char *setting = getenv("TMAGUARD_TRACE");
        value = setting != NULL && strcmp(setting, "1") == 0;
        STORE(tracing, value);
    }
    return value;
}

void tmaguard_trace(const char *format, ...) {
    if (!tmaguard_tracing()) return;
    char line[512];
    va_list args;
    va_start(args, format);
    vsnprintf(line, sizeof line, format, args);
    va_end(args);
    fprintf(stderr, "tmaguard[%d]: %s\n", (int)getpid(), line);
}

CUresult tmaguard_not_initialized(void) { return CUDA_ERROR_NOT_INITIALIZED; }

CUresult tmaguard_not_found(void) { return CUDA_ERROR_NOT_FOUND; }

/* Defined by the groups built into this library (weak: absent ones are NULL). */
HIDDEN int tmaguard_entry_source(const char *name) __attribute__((weak));
HIDDEN int tmaguard_proc_address_source(const char *name) __attribute__((weak));

/* Where `name` was resolved from (SOURCE_*); SOURCE_NONE for a name this library does not supply. Every
   library of this package exports it: the guard recognises them by it. */
EXPORT int tmaguard_shim_source(const char *name) {
    int source = SOURCE_NONE;
    if (name != NULL && tmaguard_entry_source != NULL) source = tmaguard_entry_source(name);
    if (name != NULL && source == SOURCE_NONE && tmaguard_proc_address_source != NULL)
        source = tmaguard_proc_address_source(name);
    return source;
}
