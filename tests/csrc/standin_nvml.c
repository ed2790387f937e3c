/*
 * Stand-in libnvidia-ml.so.1, configured by environment variables read at
 * every nvmlInit*: STANDIN_NVML_COUNT, _NAME, _CC, _DRIVER, _CUDA_VERSION,
 * _MIG, _VIRT, _HANG, _FAIL, _MEM_MIB, _NVLINK.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

#define NVML_P2P_CAPS_INDEX_NVLINK 2
#define NVML_P2P_STATUS_OK 0
#define NVML_P2P_STATUS_NOT_SUPPORTED 5
#define NVML_TOPOLOGY_INTERNAL 0
#define NVML_TOPOLOGY_SYSTEM 50
#define NVML_MEMORY_V2_VERSION 0x02000028u

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 64

struct standin_device {
    unsigned int index;
};
typedef struct standin_device *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

static struct {
    unsigned int count;
    char name[96];
    int cc_major, cc_minor;
    char driver[80];
    int cuda_version;
    int mig; /* -1: not supported */
    unsigned int virt;
    unsigned long long mem_total;
    int nvlink;
} g_cfg;

static struct standin_device g_devices[MAX_DEVICES];
static int g_refs;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *env_or(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return (v && *v) ? v : fallback;
}

static void load_config(void) {
    long count = strtol(env_or("STANDIN_NVML_COUNT", "1"), NULL, 10);
    g_cfg.count = count < 0 ? 0 : count > MAX_DEVICES ? MAX_DEVICES : (unsigned)count;
    snprintf(g_cfg.name, sizeof(g_cfg.name), "%s",
             env_or("STANDIN_NVML_NAME", "NVIDIA GeForce RTX 4090"));
    g_cfg.cc_major = 8;
    g_cfg.cc_minor = 9;
    sscanf(env_or("STANDIN_NVML_CC", "8.9"), "%d.%d", &g_cfg.cc_major, &g_cfg.cc_minor);
    snprintf(g_cfg.driver, sizeof(g_cfg.driver), "%s",
             env_or("STANDIN_NVML_DRIVER", "550.142"));
    g_cfg.cuda_version = (int)strtol(env_or("STANDIN_NVML_CUDA_VERSION", "12040"), NULL, 10);
    const char *mig = env_or("STANDIN_NVML_MIG", "0");
    g_cfg.mig = strcmp(mig, "unsupported") == 0 ? -1 : (strtol(mig, NULL, 10) != 0);
    g_cfg.virt = (unsigned)strtoul(env_or("STANDIN_NVML_VIRT", "0"), NULL, 10);
    g_cfg.mem_total = strtoull(env_or("STANDIN_NVML_MEM_MIB", "24576"), NULL, 10) << 20;
    g_cfg.nvlink = strtol(env_or("STANDIN_NVML_NVLINK", "0"), NULL, 10) != 0;
    for (unsigned i = 0; i < MAX_DEVICES; i++)
        g_devices[i].index = i;
}

static nvmlReturn_t do_init(void) {
    if (strcmp(env_or("STANDIN_NVML_HANG", "0"), "1") == 0) {
        /* Said once, then blocked for good: a test sees the caller arrive here, then its state. */
        fputs("standin-nvml: nvmlInit hangs\n", stderr);
        fflush(stderr);
        for (;;)
            sleep(3600);
    }
    const char *fail = getenv("STANDIN_NVML_FAIL");
    if (fail && *fail) {
        char *end;
        long code = strtol(fail, &end, 10);
        if (*end == '\0' && code != 0)
            return (nvmlReturn_t)code;
    }
    pthread_mutex_lock(&g_lock);
    load_config();
    g_refs++;
    pthread_mutex_unlock(&g_lock);
    /* The real NVML loads libcuda.so.1 in nvmlInit (measured on an H200, driver 580.159.04): whatever
       answers libcuda.so.1 is mapped from then on, so a guard must act before it calls NVML. */
    dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refs == 0)
        ret = NVML_ERROR_UNINITIALIZED;
    else
        g_refs--;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

static int initialized(void) { return __atomic_load_n(&g_refs, __ATOMIC_RELAXED) > 0; }

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 12: return "NVML Shared Library Not Found";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

/* Common prologue: initialised, valid device handle -> its index in `idx`. */
#define CHECK_DEVICE(dev, idx)                                                 \
    if (!initialized())                                                        \
        return NVML_ERROR_UNINITIALIZED;                                       \
    if (!(dev) || (dev) < g_devices || (dev) >= g_devices + g_cfg.count)       \
        return NVML_ERROR_INVALID_ARGUMENT;                                    \
    unsigned int idx = (dev)->index

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *s) {
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

/* ---- system ------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, g_cfg.driver);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    char buf[96];
    snprintf(buf, sizeof(buf), "%d.%s", g_cfg.cuda_version / 1000, g_cfg.driver);
    return copy_string(version, length, buf);
}

static nvmlReturn_t cuda_driver_version(int *v) {
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = g_cfg.cuda_version;
    return NVML_SUCCESS;
}

/* These two work without nvmlInit, like the real library. */
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!initialized())
        load_config();
    return cuda_driver_version(v);
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    return nvmlSystemGetCudaDriverVersion(v);
}

/* ---- device enumeration ------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = g_cfg.count;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) {
    return nvmlDeviceGetCount_v2(count);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= g_cfg.count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devices[index];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

static void uuid_of(unsigned int idx, char *out, size_t size) {
    snprintf(out, size, "GPU-7e57a0d0-0000-4000-8000-%012x", idx);
}

static void bus_id_of(unsigned int idx, char *out, size_t size) {
    snprintf(out, size, "00000000:%02X:00.0", (idx + 1) & 0xff);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < g_cfg.count; i++) {
        char buf[96];
        uuid_of(i, buf, sizeof(buf));
        if (strcmp(buf, uuid) == 0) {
            *device = &g_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!bus_id || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < g_cfg.count; i++) {
        char buf[32];
        bus_id_of(i, buf, sizeof(buf));
        if (strcasecmp(buf, bus_id) == 0 || strcasecmp(buf + 4, bus_id) == 0) {
            *device = &g_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    CHECK_DEVICE(dev, idx);
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = idx;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minor) {
    CHECK_DEVICE(dev, idx);
    if (!minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minor = idx;
    return NVML_SUCCESS;
}

/* ---- device properties ------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    return copy_string(name, length, g_cfg.name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    CHECK_DEVICE(dev, idx);
    char buf[96];
    uuid_of(idx, buf, sizeof(buf));
    return copy_string(uuid, length, buf);
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t dev, int *major, int *minor) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = g_cfg.cc_major;
    *minor = g_cfg.cc_minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t dev, unsigned int *arch) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!arch)
        return NVML_ERROR_INVALID_ARGUMENT;
    int ma = g_cfg.cc_major, mi = g_cfg.cc_minor;
    unsigned int a = 0xffffffffu;
    if (ma == 3) a = 2;
    else if (ma == 5) a = 3;
    else if (ma == 6) a = 4;
    else if (ma == 7) a = mi < 5 ? 5 : 6;
    else if (ma == 8) a = mi == 9 ? 8 : 7;
    else if (ma == 9) a = 9;
    else if (ma == 10 || ma == 11 || ma == 12) a = 10;
    *arch = a;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t dev, int *brand) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!brand)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strstr(g_cfg.name, "GeForce"))
        *brand = 5;
    else if (strstr(g_cfg.name, "Quadro"))
        *brand = 1;
    else if (strstr(g_cfg.name, "RTX"))
        *brand = 13;
    else
        *brand = 14; /* NVML_BRAND_NVIDIA, what data-centre parts report */
    return NVML_SUCCESS;
}

static void fill_memory(unsigned long long *total, unsigned long long *free_,
                        unsigned long long *used) {
    *total = g_cfg.mem_total;
    *used = 0;
    *free_ = g_cfg.mem_total;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *memory) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    fill_memory(&memory->total, &memory->free, &memory->used);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *memory) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    fill_memory(&memory->total, &memory->free, &memory->used);
    memory->reserved = 0;
    return NVML_SUCCESS;
}

static nvmlReturn_t pci_info(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    CHECK_DEVICE(dev, idx);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", (idx + 1) & 0xff);
    bus_id_of(idx, pci->busId, sizeof(pci->busId));
    pci->domain = 0;
    pci->bus = (idx + 1) & 0xff;
    pci->device = 0;
    pci->pciDeviceId = 0x268410DEu;
    pci->pciSubSystemId = 0x16F310DEu;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) { return pci_info(d, p); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { return pci_info(d, p); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { return pci_info(d, p); }

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!current || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g_cfg.mig < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned int)g_cfg.mig;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned int *is_mig) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int *count) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g_cfg.mig < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *count = g_cfg.mig ? 7 : 0;
    return NVML_SUCCESS;
}

/* The C type is a 4-byte enum; pynvml passes a zeroed c_ulonglong. */
EXPORT nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t dev, unsigned int *mode) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = g_cfg.virt;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t dev, int *mode) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t dev, int *mode) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t dev, int *node) {
    CHECK_DEVICE(dev, idx);
    (void)idx, (void)node;
    return NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t dev, unsigned int cpu_set_size,
                                             unsigned long *cpu_set) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!cpu_set || cpu_set_size == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    long ncpu = sysconf(_SC_NPROCESSORS_CONF);
    const unsigned bits = 8 * sizeof(unsigned long);
    memset(cpu_set, 0, cpu_set_size * sizeof(unsigned long));
    for (long c = 0; c < ncpu && (unsigned long)c < (unsigned long)cpu_set_size * bits; c++)
        cpu_set[c / bits] |= 1UL << (c % bits);
    return NVML_SUCCESS;
}

/* ---- topology and links -------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t d1, nvmlDevice_t d2, int caps_index,
                                           int *status) {
    CHECK_DEVICE(d1, i1);
    CHECK_DEVICE(d2, i2);
    (void)i1, (void)i2;
    if (!status)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (caps_index == NVML_P2P_CAPS_INDEX_NVLINK && !g_cfg.nvlink)
        *status = NVML_P2P_STATUS_NOT_SUPPORTED;
    else
        *status = NVML_P2P_STATUS_OK;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t d1, nvmlDevice_t d2,
                                                        int *level) {
    CHECK_DEVICE(d1, i1);
    CHECK_DEVICE(d2, i2);
    if (!level)
        return NVML_ERROR_INVALID_ARGUMENT;
    *level = i1 == i2 ? NVML_TOPOLOGY_INTERNAL : NVML_TOPOLOGY_SYSTEM;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, int *active) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!active)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g_cfg.nvlink)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= 18)
        return NVML_ERROR_INVALID_ARGUMENT;
    *active = 1;
    return NVML_SUCCESS;
}

/* ---- what torch.cuda's NVML helpers read ------------------------------- */

static nvmlReturn_t no_processes(nvmlDevice_t dev, unsigned int *count, void *infos) {
    CHECK_DEVICE(dev, idx);
    (void)idx, (void)infos;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, void *i) {
    return no_processes(d, c, i);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *i) {
    return no_processes(d, c, i);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i) {
    return no_processes(d, c, i);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *u) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!u)
        return NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = u->memory = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int *temp) {
    CHECK_DEVICE(dev, idx);
    (void)idx, (void)sensor;
    if (!temp)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = 40;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *milliwatts) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!milliwatts)
        return NVML_ERROR_INVALID_ARGUMENT;
    *milliwatts = 50000;
    return NVML_SUCCESS;
}

static nvmlReturn_t clock_info(nvmlDevice_t dev, unsigned int *mhz) {
    CHECK_DEVICE(dev, idx);
    (void)idx;
    if (!mhz)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mhz = 1500;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz) {
    (void)type;
    return clock_info(dev, mhz);
}
EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz) {
    (void)type;
    return clock_info(dev, mhz);
}

EXPORT int standin_is_nvml(void) { return 1; }
