/*
 * A libcuda.so.1 an attacker planted where only a setting points (tests/adversarial): its constructor
 * appends a line to PLANTED_MARKER (a path given at compile time), so a test proves it was never loaded by
 * that file's absence. It looks like a driver without CUDA 12's entry points (cuInit and
 * cuDriverGetVersion only), so the overlay would be wanted in front of it.
 */
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#ifndef PLANTED_MARKER
#error "build with -DPLANTED_MARKER=\"/path/of/the/marker\""
#endif

__attribute__((constructor)) static void planted_ran(void) {
    int fd = open(PLANTED_MARKER, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        static const char line[] = "the planted libcuda.so.1 was loaded\n";
        (void)!write(fd, line, sizeof line - 1);
        close(fd);
    }
}

int cuInit(unsigned int flags) { return flags == 0 ? 0 : 1; }

int cuDriverGetVersion(int *version) {
    if (version) *version = 11080;
    return 0;
}
