/* A CUDA driver API client for the shim tests: linked against the fake libcuda.so.1, run with the
 * shim preloaded. One mode per test scenario; each prints "key value" lines the tests parse.
 *
 *   fill CHUNK [API]      allocate CHUNK bytes until refused, print held/info, free all, print info
 *                         API: alloc (default), pitch, managed, async, pool, vmm, array, mipmap,
 *                         procaddr, procaddr2 (cuGetProcAddress_v2), dlsym
 *   hold BYTES            allocate BYTES, print "held", then wait for stdin to close (or be killed)
 *   grab CHUNK            allocate until refused, print held, wait for stdin to close, free
 *   threads N ROUNDS CHUNK LIMIT   N threads alloc/free at random; print the most the fake GPU held
 *   fork BYTES CHUNK      allocate BYTES, fork: the child fills with CHUNK and execs "fill CHUNK"
 *   launch API N US       N kernels of US microseconds through API (kernel, ex, coop, graph, procaddr,
 *                         ptsz: the per-thread-stream variant found through cuGetProcAddress);
 *                         prints the wall time, the time kernels ran, and their ratio (the share)
 *   nvml                  NVML memory of device 0 (both versions)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../../native/shim/cuda_abi.h"

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                   unsigned int, unsigned int, unsigned int, CUstream, void **);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
unsigned long long fakeCudaUsedBytes(int);
unsigned long long fakeCudaBusyNs(void);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*info_fn)(size_t *, size_t *);
typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*getproc2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static CUcontext ctx;

static void check(CUresult rc, const char *what) {
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "%s failed: %d\n", what, rc);
        exit(3);
    }
}

static void setup(void) {
    CUdevice dev;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuCtxCreate_v2(&ctx, 0, dev), "cuCtxCreate");
}

static void print_info(const char *label, info_fn info) {
    size_t free_bytes = 0, total = 0;
    check(info(&free_bytes, &total), "cuMemGetInfo");
    printf("%s_free %zu\n%s_total %zu\n", label, free_bytes, label, total);
}

/* one allocation API behind a common face: allocate, free */
struct api {
    const char *name;
    alloc_fn alloc;
    free_fn release;
};
static alloc_fn via_alloc = cuMemAlloc_v2;
static free_fn via_free = cuMemFree_v2;
static CUresult pitch_alloc(CUdeviceptr *p, size_t n) {
    size_t pitch;
    return cuMemAllocPitch_v2(p, &pitch, n / 64, 64, 4); /* n a multiple of 512*64: pitch == width */
}
static CUresult managed_alloc(CUdeviceptr *p, size_t n) { return cuMemAllocManaged(p, n, 1); }
static CUresult async_alloc(CUdeviceptr *p, size_t n) { return cuMemAllocAsync(p, n, NULL); }
static CUresult pool_alloc(CUdeviceptr *p, size_t n) { return cuMemAllocFromPoolAsync(p, n, NULL, NULL); }
static CUresult async_free(CUdeviceptr p) { return cuMemFreeAsync(p, NULL); }
static CUresult vmm_alloc(CUdeviceptr *p, size_t n) {
    CUmemAllocationProp prop = {0};
    prop.type = 1;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return cuMemCreate((CUmemGenericAllocationHandle *)p, n, &prop, 0);
}
static CUresult vmm_free(CUdeviceptr p) { return cuMemRelease(p); }
static CUresult array_alloc(CUdeviceptr *p, size_t n) {
    CUDA_ARRAY_DESCRIPTOR d = {n / 4 / 16, 16, 0x20 /* float */, 1};
    return cuArrayCreate_v2((CUarray *)p, &d);
}
static CUresult array_free(CUdeviceptr p) { return cuArrayDestroy((CUarray)(uintptr_t)p); }
static CUresult mipmap_alloc(CUdeviceptr *p, size_t n) {
    /* a 1-level mipmap is exactly one array: n bytes of floats, 16 rows */
    CUDA_ARRAY3D_DESCRIPTOR d = {n / 4 / 16, 16, 0, 0x20 /* float */, 1, 0};
    return cuMipmappedArrayCreate((CUmipmappedArray *)p, &d, 1);
}
static CUresult mipmap_free(CUdeviceptr p) { return cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)p); }

static info_fn via_info = cuMemGetInfo_v2;

static void pick_api(const char *name) {
    if (!name || !strcmp(name, "alloc")) return;
    if (!strcmp(name, "pitch")) via_alloc = pitch_alloc;
    else if (!strcmp(name, "managed")) via_alloc = managed_alloc;
    else if (!strcmp(name, "async")) via_alloc = async_alloc, via_free = async_free;
    else if (!strcmp(name, "pool")) via_alloc = pool_alloc, via_free = async_free;
    else if (!strcmp(name, "vmm")) via_alloc = vmm_alloc, via_free = vmm_free;
    else if (!strcmp(name, "array")) via_alloc = array_alloc, via_free = array_free;
    else if (!strcmp(name, "mipmap")) via_alloc = mipmap_alloc, via_free = mipmap_free;
    else if (!strcmp(name, "procaddr2")) {
        /* CUDA 12 runtimes: cuGetProcAddress_v2, with a query result */
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!h) exit(4);
        getproc2_fn getproc = (getproc2_fn)dlsym(h, "cuGetProcAddress_v2");
        CUdriverProcAddressQueryResult found;
        check(getproc("cuMemAlloc", (void **)&via_alloc, 12040, 0, &found), "cuGetProcAddress_v2(cuMemAlloc)");
        check(getproc("cuMemFree", (void **)&via_free, 12040, 0, &found), "cuGetProcAddress_v2(cuMemFree)");
        check(getproc("cuMemGetInfo", (void **)&via_info, 12040, 0, &found), "cuGetProcAddress_v2(cuMemGetInfo)");
    } else if (!strcmp(name, "procaddr") || !strcmp(name, "dlsym")) {
        /* the CUDA runtime's way: dlopen the driver, find cuGetProcAddress, ask it for base names */
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!h) exit(4);
        if (!strcmp(name, "dlsym")) {
            via_alloc = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
            via_free = (free_fn)dlsym(h, "cuMemFree_v2");
            via_info = (info_fn)dlsym(h, "cuMemGetInfo_v2");
        } else {
            getproc_fn getproc = (getproc_fn)dlsym(h, "cuGetProcAddress");
            check(getproc("cuMemAlloc", (void **)&via_alloc, 12040, 0), "cuGetProcAddress(cuMemAlloc)");
            check(getproc("cuMemFree", (void **)&via_free, 12040, 0), "cuGetProcAddress(cuMemFree)");
            check(getproc("cuMemGetInfo", (void **)&via_info, 12040, 0), "cuGetProcAddress(cuMemGetInfo)");
        }
    } else {
        fprintf(stderr, "unknown api %s\n", name);
        exit(2);
    }
}

static size_t fill(size_t chunk, CUdeviceptr **out) {
    size_t n = 0, cap = 1024;
    CUdeviceptr *ptrs = malloc(cap * sizeof *ptrs);
    CUresult rc;
    for (;;) {
        if (n == cap) ptrs = realloc(ptrs, (cap *= 2) * sizeof *ptrs);
        rc = via_alloc(&ptrs[n], chunk);
        if (rc != CUDA_SUCCESS) break;
        n++;
    }
    printf("refused_with %d\n", rc);
    *out = ptrs;
    return n;
}

static void wait_stdin(void) {
    char buf[16];
    while (read(0, buf, sizeof buf) > 0) {
    }
}

static unsigned long long most_held;
static pthread_mutex_t most_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t t_rounds, t_chunk;

static void *churn(void *arg) {
    unsigned int seed = (unsigned int)(uintptr_t)arg;
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    CUdeviceptr held[8] = {0};
    for (size_t i = 0; i < t_rounds; i++) {
        int k = rand_r(&seed) % 8;
        if (held[k]) {
            check(cuMemFree_v2(held[k]), "cuMemFree");
            held[k] = 0;
        } else if (cuMemAlloc_v2(&held[k], t_chunk * (1 + (size_t)(rand_r(&seed) % 3))) == CUDA_SUCCESS) {
            unsigned long long now = fakeCudaUsedBytes(0);
            pthread_mutex_lock(&most_lock);
            if (now > most_held) most_held = now;
            pthread_mutex_unlock(&most_lock);
        } else {
            held[k] = 0;
        }
    }
    for (int k = 0; k < 8; k++)
        if (held[k]) check(cuMemFree_v2(held[k]), "cuMemFree");
    return NULL;
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return 2;
    const char *mode = argv[1];
    if (!strcmp(mode, "nvml")) {
        nvmlDevice_t d;
        nvmlMemory_t m;
        nvmlMemory_v2_t m2 = {.version = 2};
        if (nvmlInit_v2() || nvmlDeviceGetHandleByIndex_v2(0, &d) || nvmlDeviceGetMemoryInfo(d, &m) ||
            nvmlDeviceGetMemoryInfo_v2(d, &m2))
            return 3;
        printf("nvml_total %llu\nnvml_free %llu\nnvml_used %llu\n", m.total, m.free, m.used);
        printf("nvml2_total %llu\nnvml2_free %llu\nnvml2_used %llu\n", m2.total, m2.free, m2.used);
        return 0;
    }
    setup();
    if (!strcmp(mode, "fill") && argc >= 3) {
        pick_api(argc > 3 ? argv[3] : NULL);
        size_t chunk = strtoull(argv[2], NULL, 10);
        CUdeviceptr *ptrs;
        size_t n = fill(chunk, &ptrs);
        printf("held %zu\ngpu_held %llu\n", n * chunk, fakeCudaUsedBytes(0));
        print_info("full", via_info);
        for (size_t i = 0; i < n; i++) check(via_free(ptrs[i]), "free");
        printf("gpu_after_free %llu\n", fakeCudaUsedBytes(0));
        print_info("empty", via_info);
        n = fill(chunk, &ptrs);
        printf("held_again %zu\n", n * chunk);
        return 0;
    }
    if (!strcmp(mode, "hold") && argc >= 3) {
        CUdeviceptr p;
        check(cuMemAlloc_v2(&p, strtoull(argv[2], NULL, 10)), "cuMemAlloc");
        printf("held\n");
        wait_stdin();
        return 0;
    }
    if (!strcmp(mode, "grab") && argc >= 3) {
        size_t chunk = strtoull(argv[2], NULL, 10);
        CUdeviceptr *ptrs;
        size_t n = fill(chunk, &ptrs);
        printf("held %zu\n", n * chunk);
        wait_stdin();
        for (size_t i = 0; i < n; i++) check(cuMemFree_v2(ptrs[i]), "cuMemFree");
        return 0;
    }
    if (!strcmp(mode, "threads") && argc >= 5) {
        int n = atoi(argv[2]);
        t_rounds = strtoull(argv[3], NULL, 10);
        t_chunk = strtoull(argv[4], NULL, 10);
        pthread_t tids[64];
        for (int i = 0; i < n && i < 64; i++) pthread_create(&tids[i], NULL, churn, (void *)(uintptr_t)(i + 1));
        for (int i = 0; i < n && i < 64; i++) pthread_join(tids[i], NULL);
        printf("most_held %llu\ngpu_after %llu\n", most_held, fakeCudaUsedBytes(0));
        print_info("after", cuMemGetInfo_v2);
        return 0;
    }
    if (!strcmp(mode, "fork") && argc >= 4) {
        CUdeviceptr p;
        check(cuMemAlloc_v2(&p, strtoull(argv[2], NULL, 10)), "cuMemAlloc");
        fflush(stdout);
        pid_t child = fork();
        if (child == 0) {
            /* a CUDA context does not survive fork: the child makes its own, as real programs do */
            setup();
            CUdeviceptr *ptrs;
            size_t n = fill(strtoull(argv[3], NULL, 10), &ptrs);
            printf("child_held %llu\n", (unsigned long long)n * strtoull(argv[3], NULL, 10));
            fflush(stdout);
            char *args[] = {argv[0], "fill", argv[3], NULL};
            execv("/proc/self/exe", args);
            _exit(5);
        }
        int status;
        waitpid(child, &status, 0);
        printf("child_status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128);
        return 0;
    }
    if (!strcmp(mode, "launch") && argc >= 5) {
        const char *api = argv[2];
        long n = atol(argv[3]);
        unsigned int us = (unsigned int)atoi(argv[4]);
        getproc_fn getproc = NULL;
        typeof(cuLaunchKernel) *launch = cuLaunchKernel;
        if (!strcmp(api, "procaddr") || !strcmp(api, "ptsz")) {
            /* ptsz: the per-thread default stream flag (1 << 1) returns cuLaunchKernel_ptsz */
            void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
            getproc = (getproc_fn)dlsym(h, "cuGetProcAddress");
            cuuint64_t flags = strcmp(api, "ptsz") ? 0 : 2;
            check(getproc("cuLaunchKernel", (void **)&launch, 12040, flags), "cuGetProcAddress(cuLaunchKernel)");
        }
        double t0 = seconds();
        printf("start_s %.6f\n", t0);
        for (long i = 0; i < n; i++) {
            CUresult rc;
            if (!strcmp(api, "ex")) {
                CUlaunchConfig c = {us, 1, 1, 1, 1, 1, 0, NULL, NULL, 0};
                rc = cuLaunchKernelEx(&c, NULL, NULL, NULL);
            } else if (!strcmp(api, "coop")) {
                rc = cuLaunchCooperativeKernel(NULL, us, 1, 1, 1, 1, 1, 0, NULL, NULL);
            } else if (!strcmp(api, "graph")) {
                rc = cuGraphLaunch((CUgraphExec)(uintptr_t)us, NULL);
            } else {
                rc = launch(NULL, us, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            }
            check(rc, "launch");
        }
        double wall = seconds() - t0;
        double busy = fakeCudaBusyNs() / 1e9;
        printf("wall_s %.6f\nbusy_s %.6f\nshare %.4f\nend_s %.6f\n", wall, busy, busy / wall, t0 + wall);
        return 0;
    }
    fprintf(stderr, "usage: see the comment at the top of driver_client.c\n");
    return 2;
}
