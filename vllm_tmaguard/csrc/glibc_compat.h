/*
 * Included ahead of every source by setup.py (-include), so the built libraries load with glibc 2.28
 * (manylinux_2_28) whatever glibc builds them. From glibc 2.34 the dl* functions live in libc.so.6 under
 * a new version, GLIBC_2.34, which a newer toolchain binds by default; the original versions are still
 * exported there for old programs, and they are what an older glibc's libdl.so.2 (a DT_NEEDED of every
 * library, see setup.py) exports. Binding the original versions works on both.
 */
#if defined(__gnu_linux__) && defined(__x86_64__) /* __gnu_linux__: a glibc target, not musl */
#define TMAGUARD_GLIBC_BASE "GLIBC_2.2.5"
#define TMAGUARD_GLIBC_DLINFO "GLIBC_2.3.3" /* dlinfo arrived later than the rest on x86-64 */
#elif defined(__gnu_linux__) && defined(__aarch64__)
#define TMAGUARD_GLIBC_BASE "GLIBC_2.17"
#define TMAGUARD_GLIBC_DLINFO "GLIBC_2.17"
#endif

#ifdef TMAGUARD_GLIBC_BASE
__asm__(".symver dlopen,dlopen@" TMAGUARD_GLIBC_BASE);
__asm__(".symver dlsym,dlsym@" TMAGUARD_GLIBC_BASE);
__asm__(".symver dlvsym,dlvsym@" TMAGUARD_GLIBC_BASE);
__asm__(".symver dlclose,dlclose@" TMAGUARD_GLIBC_BASE);
__asm__(".symver dlerror,dlerror@" TMAGUARD_GLIBC_BASE);
__asm__(".symver dladdr,dladdr@" TMAGUARD_GLIBC_BASE);
__asm__(".symver dlinfo,dlinfo@" TMAGUARD_GLIBC_DLINFO);
#endif
