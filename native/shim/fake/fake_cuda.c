/* A fake libcuda.so.1 for tests, benchmarks and ``gpuslice serve --simulate``: no GPU, no CUDA SDK.
 *
 * Device memory is host memory (malloc), each device has FAKE_CUDA_MEMORY_BYTES (default 80 GiB) and
 * refuses allocations beyond it, as a real GPU does. A kernel is a timed sleep of its grid's X
 * dimension in microseconds (cuLaunchKernel(f, 1000, ...) runs 1 ms), run in the launching thread, so
 * events recorded around it measure its duration; a graph launch sleeps the number of microseconds
 * its CUgraphExec handle holds. Contexts are per thread, as in CUDA: cuCtxCreate_v2 or cuCtxSetCurrent
 * first, or allocations fail with CUDA_ERROR_INVALID_CONTEXT. Streams are NULL or any pointer.
 * FAKE_CUDA_DEVICES sets the device count (default 1).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cuda_abi.h"

#define API __attribute__((visibility("default")))
#define MAX_DEVICES 16

static _Thread_local int current = -1; /* device of this thread's context */
static atomic_ullong used[MAX_DEVICES];

static unsigned long long capacity(void) {
    const char *text = getenv("FAKE_CUDA_MEMORY_BYTES");
    return text && *text ? strtoull(text, NULL, 10) : 80ull << 30;
}

static int device_count(void) {
    const char *text = getenv("FAKE_CUDA_DEVICES");
    int n = text && *text ? atoi(text) : 1;
    return n < 1 ? 1 : n > MAX_DEVICES ? MAX_DEVICES : n;
}

static unsigned long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static void run_for_us(unsigned long long us) {
    if (us == 0) return; /* an empty kernel: launch overhead only */
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Every block starts with its size and device, so frees give the memory back to the right device. */
struct block {
    unsigned long long bytes;
    int dev;
    int pad;
};

static CUresult take(int dev, size_t bytes, void **out) {
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long before = atomic_fetch_add(&used[dev], bytes);
    if (before + bytes > capacity()) {
        atomic_fetch_sub(&used[dev], bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Only the header is touched: the rest stays untouched virtual memory, like an idle GPU buffer. */
    struct block *b = malloc(sizeof *b + bytes);
    if (!b) {
        atomic_fetch_sub(&used[dev], bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    b->bytes = bytes;
    b->dev = dev;
    *out = b + 1;
    return CUDA_SUCCESS;
}

static CUresult give(void *p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    struct block *b = (struct block *)p - 1;
    atomic_fetch_sub(&used[b->dev], b->bytes);
    free(b);
    return CUDA_SUCCESS;
}

/* What the fake GPU really holds: tests check the shim never lets a job past its limit. */
API unsigned long long fakeCudaUsedBytes(int dev) { return dev >= 0 && dev < MAX_DEVICES ? atomic_load(&used[dev]) : 0; }

API CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
API CUresult cuDriverGetVersion(int *v) { *v = 12040; return CUDA_SUCCESS; }
API CUresult cuDeviceGetCount(int *n) { *n = device_count(); return CUDA_SUCCESS; }
API CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal < 0 || ordinal >= device_count()) return CUDA_ERROR_INVALID_VALUE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { (void)d; *bytes = capacity(); return CUDA_SUCCESS; }
API CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice d) {
    (void)flags;
    if (d < 0 || d >= device_count()) return CUDA_ERROR_INVALID_VALUE;
    current = d;
    *ctx = (CUcontext)(uintptr_t)(d + 1);
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) {
    if (d < 0 || d >= device_count()) return CUDA_ERROR_INVALID_VALUE;
    *ctx = (CUcontext)(uintptr_t)(d + 1);
    return CUDA_SUCCESS;
}
API CUresult cuCtxSetCurrent(CUcontext ctx) { current = ctx ? (int)(uintptr_t)ctx - 1 : -1; return CUDA_SUCCESS; }
API CUresult cuCtxGetCurrent(CUcontext *ctx) {
    *ctx = current < 0 ? NULL : (CUcontext)(uintptr_t)(current + 1);
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetDevice(CUdevice *d) {
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *d = current;
    return CUDA_SUCCESS;
}
API CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return take(current, n, (void **)p); }
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int f) { (void)f; return take(current, n, (void **)p); }
API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e) {
    (void)e;
    *pitch = (w + 511) / 512 * 512;
    return take(current, *pitch * h, (void **)p);
}
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return take(current, n, (void **)p); }
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return cuMemAllocAsync(p, n, s); }
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)pool;
    (void)s;
    return take(current, n, (void **)p);
}
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    return cuMemAllocFromPoolAsync(p, n, pool, s);
}
API CUresult cuMemFree_v2(CUdeviceptr p) { return give((void *)(uintptr_t)p); }
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return give((void *)(uintptr_t)p); }
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }
API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
                         unsigned long long flags) {
    (void)flags;
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : current;
    if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_VALUE;
    return take(dev, n, (void **)h);
}
API CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return give((void *)(uintptr_t)h); }
API CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    size_t bytes = d->Width * (d->Height ? d->Height : 1) * d->NumChannels * 4;
    return take(current, bytes, (void **)a);
}
API CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    size_t bytes = d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) * d->NumChannels * 4;
    return take(current, bytes, (void **)a);
}
API CUresult cuArrayDestroy(CUarray a) { return give(a); }
API CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    size_t bytes = 0, w = d->Width ? d->Width : 1, h = d->Height ? d->Height : 1, z = d->Depth ? d->Depth : 1;
    for (unsigned int l = 0; l < (levels ? levels : 1); l++, w = w > 1 ? w / 2 : 1, h = h > 1 ? h / 2 : 1,
                      z = z > 1 ? z / 2 : 1)
        bytes += w * h * z;
    return take(current, bytes * d->NumChannels * 4, (void **)a);
}
API CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return give(a); }
API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    unsigned long long cap = capacity(), held = atomic_load(&used[current]);
    *total = cap;
    *free_bytes = cap > held ? cap - held : 0;
    return CUDA_SUCCESS;
}

/* kernels */
static atomic_ullong launches, busy_ns;
API unsigned long long fakeCudaLaunchCount(void) { return atomic_load(&launches); }
/* Time this process's kernels really ran (a sleep overshoots its request by tens of microseconds). */
API unsigned long long fakeCudaBusyNs(void) { return atomic_load(&busy_ns); }

static CUresult run_kernel(unsigned int grid_x) {
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    atomic_fetch_add(&launches, 1);
    unsigned long long t0 = now_ns();
    run_for_us(grid_x);
    atomic_fetch_add(&busy_ns, now_ns() - t0);
    return CUDA_SUCCESS;
}

API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                            unsigned int by, unsigned int bz, unsigned int shared, CUstream s, void **params,
                            void **extra) {
    (void)f, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)s, (void)params, (void)extra;
    return run_kernel(gx);
}
API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                 unsigned int by, unsigned int bz, unsigned int shared, CUstream s, void **params,
                                 void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
}
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                                       CUstream s, void **params) {
    (void)f, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)s, (void)params;
    return run_kernel(gx);
}
API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                            unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                                            CUstream s, void **params) {
    return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, s, params);
}
API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)f, (void)params, (void)extra;
    return c ? run_kernel(c->gridDimX) : CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    return cuLaunchKernelEx(c, f, params, extra);
}
API CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    (void)s;
    return run_kernel((unsigned int)(uintptr_t)g);
}
API CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return cuGraphLaunch(g, s); }
API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status) { (void)s; *status = 0; return CUDA_SUCCESS; }

/* events: a timestamp taken when recorded; kernels run synchronously, so recorded means complete */
struct event {
    unsigned long long at;
    int recorded;
};
API CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    (void)flags;
    *e = calloc(1, sizeof(struct event));
    return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
API CUresult cuEventDestroy_v2(CUevent e) { free(e); return CUDA_SUCCESS; }
API CUresult cuEventRecord(CUevent e, CUstream s) {
    (void)s;
    struct event *ev = (struct event *)e;
    ev->at = now_ns();
    ev->recorded = 1;
    return CUDA_SUCCESS;
}
API CUresult cuEventQuery(CUevent e) { (void)e; return CUDA_SUCCESS; }
API CUresult cuEventSynchronize(CUevent e) { (void)e; return CUDA_SUCCESS; }
API CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    struct event *x = (struct event *)a, *y = (struct event *)b;
    if (!x->recorded || !y->recorded) return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)((double)(y->at - x->at) / 1e6);
    return CUDA_SUCCESS;
}

/* cuGetProcAddress: base names, as the CUDA runtime asks for them, resolved to the newest variant,
 * and to the per-thread-default-stream variant when flags ask for it (CU_GET_PROC_ADDRESS_PER_THREAD_
 * DEFAULT_STREAM = 1 << 1). */
API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
static const struct { const char *name; void *fn; } TABLE[] = {
#define F(name, fn) {name, (void *)fn}
    F("cuInit", cuInit), F("cuDriverGetVersion", cuDriverGetVersion), F("cuDeviceGet", cuDeviceGet),
    F("cuDeviceGetCount", cuDeviceGetCount), F("cuCtxCreate", cuCtxCreate_v2), F("cuCtxSetCurrent", cuCtxSetCurrent),
    F("cuCtxGetCurrent", cuCtxGetCurrent), F("cuCtxGetDevice", cuCtxGetDevice),
    F("cuMemAlloc", cuMemAlloc_v2), F("cuMemAllocManaged", cuMemAllocManaged), F("cuMemAllocPitch", cuMemAllocPitch_v2),
    F("cuMemAllocAsync", cuMemAllocAsync), F("cuMemAllocAsync_ptsz", cuMemAllocAsync_ptsz),
    F("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync),
    F("cuMemAllocFromPoolAsync_ptsz", cuMemAllocFromPoolAsync_ptsz), F("cuMemFree", cuMemFree_v2),
    F("cuMemFreeAsync", cuMemFreeAsync), F("cuMemFreeAsync_ptsz", cuMemFreeAsync_ptsz),
    F("cuMemCreate", cuMemCreate), F("cuMemRelease", cuMemRelease), F("cuArrayCreate", cuArrayCreate_v2),
    F("cuArray3DCreate", cuArray3DCreate_v2), F("cuArrayDestroy", cuArrayDestroy),
    F("cuMemGetInfo", cuMemGetInfo_v2), F("cuLaunchKernel", cuLaunchKernel), F("cuLaunchKernel_ptsz", cuLaunchKernel_ptsz),
    F("cuLaunchKernelEx", cuLaunchKernelEx), F("cuLaunchKernelEx_ptsz", cuLaunchKernelEx_ptsz),
    F("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel),
    F("cuLaunchCooperativeKernel_ptsz", cuLaunchCooperativeKernel_ptsz), F("cuGraphLaunch", cuGraphLaunch),
    F("cuGraphLaunch_ptsz", cuGraphLaunch_ptsz), F("cuEventCreate", cuEventCreate),
    F("cuEventDestroy", cuEventDestroy_v2), F("cuEventRecord", cuEventRecord), F("cuEventQuery", cuEventQuery),
    F("cuEventSynchronize", cuEventSynchronize), F("cuEventElapsedTime", cuEventElapsedTime),
    F("cuStreamIsCapturing", cuStreamIsCapturing), F("cuGetProcAddress", cuGetProcAddress),
#undef F
};

static void *lookup(const char *name) {
    for (size_t i = 0; i < sizeof TABLE / sizeof *TABLE; i++)
        if (strcmp(TABLE[i].name, name) == 0) return TABLE[i].fn;
    return NULL;
}

API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    (void)version;
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    void *fn = NULL;
    if (flags & 2) {
        char ptsz[128];
        snprintf(ptsz, sizeof ptsz, "%s_ptsz", symbol);
        fn = lookup(ptsz);
    }
    if (!fn) fn = lookup(symbol);
    *pfn = fn;
    return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status) {
    CUresult rc = cuGetProcAddress(symbol, pfn, version, flags);
    if (status) *status = rc == CUDA_SUCCESS ? 0 : 1;
    return rc;
}
