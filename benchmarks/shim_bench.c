/* Driver-API load for benchmarks/shim.py, linked against the fake libcuda.so.1 (native/shim/fake).
 *
 *   alloc N BYTES         N cuMemAlloc_v2 + cuMemFree_v2 pairs: ns per pair
 *   launch N              N empty cuLaunchKernel calls: ns per launch
 *   loop SECONDS US       back-to-back US-microsecond kernels for SECONDS: the share of time they ran
 *   probe N US GAP_US     N kernels of US microseconds, GAP_US apart: delay added to each launch
 *                         (call time less the kernel's own run time), p50 and p99 in microseconds
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../native/shim/cuda_abi.h"

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, CUstream, void **, void **);
unsigned long long fakeCudaBusyNs(void);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static CUresult kernel(unsigned int us) { return cuLaunchKernel(NULL, us, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL); }

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    if (argc < 3 || cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev)) return 2;
    const char *mode = argv[1];
    if (!strcmp(mode, "alloc") && argc >= 4) {
        long n = atol(argv[2]);
        size_t bytes = strtoull(argv[3], NULL, 10);
        double t0 = now();
        for (long i = 0; i < n; i++) {
            CUdeviceptr p;
            if (cuMemAlloc_v2(&p, bytes) || cuMemFree_v2(p)) return 3;
        }
        printf("ns_per_op %.1f\n", (now() - t0) * 1e9 / n);
    } else if (!strcmp(mode, "launch")) {
        long n = atol(argv[2]);
        double t0 = now();
        for (long i = 0; i < n; i++)
            if (kernel(0)) return 3;
        printf("ns_per_op %.1f\n", (now() - t0) * 1e9 / n);
    } else if (!strcmp(mode, "loop") && argc >= 4) {
        double seconds = atof(argv[2]), t0 = now();
        unsigned int us = (unsigned int)atoi(argv[3]);
        long n = 0;
        while (now() - t0 < seconds) {
            if (kernel(us)) return 3;
            n++;
        }
        double wall = now() - t0;
        printf("launches %ld\nwall_s %.4f\nshare %.4f\n", n, wall, fakeCudaBusyNs() / 1e9 / wall);
    } else if (!strcmp(mode, "probe") && argc >= 5) {
        long n = atol(argv[2]);
        unsigned int us = (unsigned int)atoi(argv[3]);
        struct timespec gap = {0, atol(argv[4]) * 1000};
        double *delay = calloc((size_t)n, sizeof *delay);
        for (long i = 0; i < n; i++) {
            unsigned long long busy = fakeCudaBusyNs();
            double t0 = now();
            if (kernel(us)) return 3;
            delay[i] = (now() - t0) * 1e6 - (fakeCudaBusyNs() - busy) / 1e3;
            nanosleep(&gap, NULL);
        }
        qsort(delay, (size_t)n, sizeof *delay, by_value);
        printf("p50_us %.1f\np99_us %.1f\n", delay[n / 2], delay[(n * 99) / 100]);
    } else {
        return 2;
    }
    return 0;
}
