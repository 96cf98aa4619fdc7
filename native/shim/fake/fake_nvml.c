/* A fake libnvidia-ml.so.1 for tests and ``gpuslice serve --simulate``: FAKE_CUDA_DEVICES devices
 * (default 1) named by FAKE_CUDA_UUIDS (comma-separated; default GPU-fake-<index>), each with
 * FAKE_CUDA_MEMORY_BYTES (default 80 GiB), none used. Enough of NVML for a program (nvidia-smi, a
 * framework) to ask a device's memory. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cuda_abi.h"

#define API __attribute__((visibility("default")))

static unsigned long long capacity(void) {
    const char *text = getenv("FAKE_CUDA_MEMORY_BYTES");
    return text && *text ? strtoull(text, NULL, 10) : 80ull << 30;
}

static unsigned int device_count(void) {
    const char *text = getenv("FAKE_CUDA_DEVICES");
    int n = text && *text ? atoi(text) : 1;
    return n < 1 ? 1 : n > 16 ? 16 : (unsigned int)n;
}

static int index_of(nvmlDevice_t d) {
    uintptr_t i = (uintptr_t)d;
    return i >= 1 && i <= device_count() ? (int)i - 1 : -1;
}

API nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
API nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = device_count(); return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i >= device_count()) return NVML_ERROR_INVALID_ARGUMENT;
    *d = (nvmlDevice_t)(uintptr_t)(i + 1);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    int i = index_of(d);
    if (i < 0 || !uuid) return NVML_ERROR_INVALID_ARGUMENT;
    const char *names = getenv("FAKE_CUDA_UUIDS");
    for (int k = 0; names && *names; k++) {
        const char *end = strchr(names, ',');
        int n = end ? (int)(end - names) : (int)strlen(names);
        if (k == i) {
            snprintf(uuid, length, "%.*s", n, names);
            return NVML_SUCCESS;
        }
        names = end ? end + 1 : names + n;
    }
    snprintf(uuid, length, "GPU-fake-%d", i);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (index_of(d) < 0 || !m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = m->free = capacity();
    m->used = 0;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (index_of(d) < 0 || !m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = m->free = capacity();
    m->used = m->reserved = 0;
    return NVML_SUCCESS;
}
