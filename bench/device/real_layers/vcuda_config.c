/* Writes tkestack vCUDA's controller configuration (/etc/vcuda/vcuda.config: its resource_data_t, from the
 * vcuda-controller source tree this is compiled against) with a memory quota, and its pids.config.
 * VCUDA_WHOLE_GPUS=N: what gpu-manager writes for a container of N whole GPUs instead (its virtual-manager
 * at tkestack/gpu-manager 8cd842e: utilization = the container's cores, enable = 0, no memory limit): the
 * hooks limit nothing. gpu-manager gives a limited (shared) container exactly one GPU.
 * usage: vcuda_config CONFIG_DIR QUOTA_BYTES [PID ...]   (build: bench/device/real_layers/build.sh) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "include/hijack.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s CONFIG_DIR QUOTA_BYTES [PID ...]\n", argv[0]);
        return 2;
    }
    resource_data_t config;
    memset(&config, 0, sizeof config);
    snprintf(config.pod_uid, sizeof config.pod_uid, "tmaguard-device-pod");
    snprintf(config.container_name, sizeof config.container_name, "vllm");
    config.gpu_memory = strtoull(argv[2], NULL, 10);
    config.limit = 100;
    config.utilization = 100;
    config.hard_limit = 0;
    config.enable = 1;
    const char *whole = getenv("VCUDA_WHOLE_GPUS");
    if (whole && atoi(whole) > 0) {
        config.utilization = 100 * atoi(whole);
        config.limit = 0;
        config.hard_limit = 1;
        config.gpu_memory = 0;
        config.enable = 0;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/vcuda.config", argv[1]);
    FILE *file = fopen(path, "wb");
    if (!file || fwrite(&config, sizeof config, 1, file) != 1) {
        perror(path);
        return 1;
    }
    fclose(file);
    snprintf(path, sizeof path, "%s/pids.config", argv[1]);
    file = fopen(path, "wb");
    for (int i = 3; file && i < argc; i++) {
        int pid = atoi(argv[i]);
        fwrite(&pid, sizeof pid, 1, file);
    }
    if (file)
        fclose(file);
    printf("%s: resource_data_t of %zu bytes, gpu_memory %llu, enable %d\n", argv[1], sizeof config,
           (unsigned long long)config.gpu_memory, config.enable);
    return 0;
}
