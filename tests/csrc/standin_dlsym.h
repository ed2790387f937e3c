/*
 * The C library's own dlsym, for stand-ins that interpose dlsym themselves (HAMi-core, vgpu-manager and
 * nvshare export a dlsym of their own, and so do their stand-ins): glibc 2.34 versions it anew, older ones
 * as GLIBC_2.2.5 (x86-64).
 */
#ifndef STANDIN_DLSYM_H
#define STANDIN_DLSYM_H

#include <dlfcn.h>

typedef void *(*dlsym_fn)(void *, const char *);

static dlsym_fn real_dlsym(void) {
    static dlsym_fn fn;
    if (!fn)
        fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!fn)
        fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return fn;
}

#endif
