/* gpuslice shim: holds every CUDA process of a job to its slice (memory and compute share).
 *
 * Loaded with LD_PRELOAD into the job's processes. Three ways in, all ending at the same hooks:
 *   1. symbol interposition: a program linked against libcuda calls our cuMemAlloc_v2 first;
 *   2. dlsym: a program (the CUDA runtime, PyTorch, ctypes) that dlopens libcuda.so.1 and looks a
 *      symbol up gets our hook; dlsym is the one libc function we override (see dlsym below);
 *   3. cuGetProcAddress / cuGetProcAddress_v2, through which CUDA >= 11.3 runtimes find driver entry
 *      points: we ask the real one, and when it answers with a function we hook, hand out the hook.
 *
 * Lifecycle of one process:
 *   first hooked call -> shim_init (once): read GPUSLICE_* env, map the job region (create it when
 *                        missing), resolve the real driver; any problem -> pass-through + one warning
 *   allocation        -> reserve(bytes) under the job lock (refused: CUDA_ERROR_OUT_OF_MEMORY, nothing
 *                        allocated) -> real allocation -> on failure release(bytes)
 *   free              -> real free -> release(bytes the allocation reserved)
 *   launch            -> yield while a high/realtime job is active on this GPU (lower priorities only)
 *                        -> wait for compute tokens (shares < 100 %) -> events around the real launch;
 *                        measured kernel time is charged to the job's bucket when the end event completes
 *   fork              -> the child takes a slot of its own; exec keeps LD_PRELOAD and GPUSLICE_* env
 *
 * What it cannot stop is written down in docs/shim.md.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "region.h"

#define EXPORT __attribute__((visibility("default")))
#define PITCH_ALIGN_BYTES 512 /* the largest pitch alignment CUDA devices use (texturePitchAlignment) */
#define PENDING_SLOTS 64      /* kernels measured in flight per process before a launch waits */

/* ---- logging --------------------------------------------------------------------------------- */

static atomic_int g_warned;

static void warn_once(const char *fmt, ...) {
    if (atomic_exchange(&g_warned, 1)) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpuslice-shim: warning: %s\n", line);
}

/* ---- the real dlsym, and the real driver --------------------------------------------------------- */

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn g_real_dlsym;

static dlsym_fn real_dlsym(void) {
    dlsym_fn fn = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (fn) return fn;
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof versions / sizeof *versions && !fn; i++)
        fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    __atomic_store_n(&g_real_dlsym, fn, __ATOMIC_RELEASE);
    return fn;
}

/* ``name`` in the already loaded ``library``: the next definition after the shim, else the library's
 * own (opened RTLD_LOCAL, as ctypes does). Never loads a library the process has not loaded. */
static void *resolve(const char *library, const char *name) {
    dlsym_fn sym = real_dlsym();
    if (!sym) return NULL;
    void *p = sym(RTLD_NEXT, name);
    if (p) return p;
    void *handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
    return handle ? sym(handle, name) : NULL;
}

/* Real entry points we call without hooking them. */
static CUresult (*r_cuCtxGetDevice)(CUdevice *);
static CUresult (*r_cuCtxGetCurrent)(CUcontext *);
static CUresult (*r_cuEventCreate)(CUevent *, unsigned int);
static CUresult (*r_cuEventDestroy)(CUevent);
static CUresult (*r_cuEventRecord)(CUevent, CUstream);
static CUresult (*r_cuEventQuery)(CUevent);
static CUresult (*r_cuEventSynchronize)(CUevent);
static CUresult (*r_cuEventElapsedTime)(float *, CUevent, CUevent);
static CUresult (*r_cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
static nvmlReturn_t (*r_nvmlDeviceGetUUID)(nvmlDevice_t, char *, unsigned int);

/* Real entry points we hook: one pointer each, filled by shim_init. */
#define HOOKED(ret, name, params) \
    static ret (*r_##name) params; \
    EXPORT ret name params;
HOOKED(CUresult, cuMemAlloc_v2, (CUdeviceptr *, size_t))
HOOKED(CUresult, cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned int))
HOOKED(CUresult, cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned int))
HOOKED(CUresult, cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))
HOOKED(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *, size_t, CUstream))
HOOKED(CUresult, cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))
HOOKED(CUresult, cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))
HOOKED(CUresult, cuMemFree_v2, (CUdeviceptr))
HOOKED(CUresult, cuMemFreeAsync, (CUdeviceptr, CUstream))
HOOKED(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr, CUstream))
HOOKED(CUresult, cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                               unsigned long long))
HOOKED(CUresult, cuMemRelease, (CUmemGenericAllocationHandle))
HOOKED(CUresult, cuArrayCreate_v2, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))
HOOKED(CUresult, cuArray3DCreate_v2, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))
HOOKED(CUresult, cuArrayDestroy, (CUarray))
HOOKED(CUresult, cuMipmappedArrayCreate, (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int))
HOOKED(CUresult, cuMipmappedArrayDestroy, (CUmipmappedArray))
HOOKED(CUresult, cuMemGetInfo_v2, (size_t *, size_t *))
HOOKED(CUresult, cuLaunchKernel, (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                  unsigned int, unsigned int, unsigned int, CUstream, void **, void **))
HOOKED(CUresult, cuLaunchKernel_ptsz, (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                       unsigned int, unsigned int, unsigned int, CUstream, void **, void **))
HOOKED(CUresult, cuLaunchKernelEx, (const CUlaunchConfig *, CUfunction, void **, void **))
HOOKED(CUresult, cuLaunchKernelEx_ptsz, (const CUlaunchConfig *, CUfunction, void **, void **))
HOOKED(CUresult, cuLaunchCooperativeKernel, (CUfunction, unsigned int, unsigned int, unsigned int,
                                             unsigned int, unsigned int, unsigned int, unsigned int,
                                             CUstream, void **))
HOOKED(CUresult, cuLaunchCooperativeKernel_ptsz, (CUfunction, unsigned int, unsigned int, unsigned int,
                                                  unsigned int, unsigned int, unsigned int, unsigned int,
                                                  CUstream, void **))
HOOKED(CUresult, cuGraphLaunch, (CUgraphExec, CUstream))
HOOKED(CUresult, cuGraphLaunch_ptsz, (CUgraphExec, CUstream))
HOOKED(CUresult, cuGetProcAddress, (const char *, void **, int, cuuint64_t))
HOOKED(CUresult, cuGetProcAddress_v2, (const char *, void **, int, cuuint64_t,
                                       CUdriverProcAddressQueryResult *))
HOOKED(nvmlReturn_t, nvmlDeviceGetMemoryInfo, (nvmlDevice_t, nvmlMemory_t *))
HOOKED(nvmlReturn_t, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t, nvmlMemory_v2_t *))

#define CUDA_LIB "libcuda.so.1"
#define NVML_LIB "libnvidia-ml.so.1"
#define ENTRY(lib, name) {#name, lib, (void *)name, (void **)&r_##name}
static const struct hook {
    const char *name;
    const char *library;
    void *hook;
    void **real;
} HOOKS[] = {
    ENTRY(CUDA_LIB, cuMemAlloc_v2),
    ENTRY(CUDA_LIB, cuMemAllocPitch_v2),
    ENTRY(CUDA_LIB, cuMemAllocManaged),
    ENTRY(CUDA_LIB, cuMemAllocAsync),
    ENTRY(CUDA_LIB, cuMemAllocAsync_ptsz),
    ENTRY(CUDA_LIB, cuMemAllocFromPoolAsync),
    ENTRY(CUDA_LIB, cuMemAllocFromPoolAsync_ptsz),
    ENTRY(CUDA_LIB, cuMemFree_v2),
    ENTRY(CUDA_LIB, cuMemFreeAsync),
    ENTRY(CUDA_LIB, cuMemFreeAsync_ptsz),
    ENTRY(CUDA_LIB, cuMemCreate),
    ENTRY(CUDA_LIB, cuMemRelease),
    ENTRY(CUDA_LIB, cuArrayCreate_v2),
    ENTRY(CUDA_LIB, cuArray3DCreate_v2),
    ENTRY(CUDA_LIB, cuArrayDestroy),
    ENTRY(CUDA_LIB, cuMipmappedArrayCreate),
    ENTRY(CUDA_LIB, cuMipmappedArrayDestroy),
    ENTRY(CUDA_LIB, cuMemGetInfo_v2),
    ENTRY(CUDA_LIB, cuLaunchKernel),
    ENTRY(CUDA_LIB, cuLaunchKernel_ptsz),
    ENTRY(CUDA_LIB, cuLaunchKernelEx),
    ENTRY(CUDA_LIB, cuLaunchKernelEx_ptsz),
    ENTRY(CUDA_LIB, cuLaunchCooperativeKernel),
    ENTRY(CUDA_LIB, cuLaunchCooperativeKernel_ptsz),
    ENTRY(CUDA_LIB, cuGraphLaunch),
    ENTRY(CUDA_LIB, cuGraphLaunch_ptsz),
    ENTRY(CUDA_LIB, cuGetProcAddress),
    ENTRY(CUDA_LIB, cuGetProcAddress_v2),
    ENTRY(NVML_LIB, nvmlDeviceGetMemoryInfo),
    ENTRY(NVML_LIB, nvmlDeviceGetMemoryInfo_v2),
};
#define NHOOKS (sizeof HOOKS / sizeof *HOOKS)

static const struct helper {
    const char *name;
    const char *library;
    void **real;
} HELPERS[] = {
    {"cuCtxGetDevice", CUDA_LIB, (void **)&r_cuCtxGetDevice},
    {"cuCtxGetCurrent", CUDA_LIB, (void **)&r_cuCtxGetCurrent},
    {"cuEventCreate", CUDA_LIB, (void **)&r_cuEventCreate},
    {"cuEventDestroy_v2", CUDA_LIB, (void **)&r_cuEventDestroy},
    {"cuEventRecord", CUDA_LIB, (void **)&r_cuEventRecord},
    {"cuEventQuery", CUDA_LIB, (void **)&r_cuEventQuery},
    {"cuEventSynchronize", CUDA_LIB, (void **)&r_cuEventSynchronize},
    {"cuEventElapsedTime", CUDA_LIB, (void **)&r_cuEventElapsedTime},
    {"cuStreamIsCapturing", CUDA_LIB, (void **)&r_cuStreamIsCapturing},
    {"nvmlDeviceGetUUID", NVML_LIB, (void **)&r_nvmlDeviceGetUUID},
};
#define NHELPERS (sizeof HELPERS / sizeof *HELPERS)

/* Fill every real pointer still unknown: a library loaded after the shim started (NVML opened late,
 * libcuda dlopened by the runtime) is picked up on the next call that needs it. */
static void resolve_missing(void) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < NHOOKS; i++)
        if (!__atomic_load_n(HOOKS[i].real, __ATOMIC_ACQUIRE))
            __atomic_store_n(HOOKS[i].real, resolve(HOOKS[i].library, HOOKS[i].name), __ATOMIC_RELEASE);
    for (size_t i = 0; i < NHELPERS; i++)
        if (!__atomic_load_n(HELPERS[i].real, __ATOMIC_ACQUIRE))
            __atomic_store_n(HELPERS[i].real, resolve(HELPERS[i].library, HELPERS[i].name), __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
}

static void *match_hook(void *real) {
    for (size_t i = 0; i < NHOOKS; i++)
        if (__atomic_load_n(HOOKS[i].real, __ATOMIC_ACQUIRE) == real) return HOOKS[i].hook;
    return NULL;
}

/* The hook for a real driver function, or the function itself when we do not hook it. */
static void *substitute(void *real) {
    if (!real) return real;
    void *hook = match_hook(real);
    if (!hook) {
        resolve_missing();
        hook = match_hook(real);
    }
    return hook ? hook : real;
}

/* ---- configuration and state --------------------------------------------------------------------- */

static struct {
    bool enforce;             /* false: pass-through (bad or missing configuration) */
    uint32_t compute_percent; /* 1..100 */
    int priority;             /* 0..4 */
    uint64_t active_window_ns;
    uint64_t burst_ns;        /* bucket capacity at 100 %: GPU time a job may bank */
    char uuids[GS_MAX_DEVICES][NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    int nuuids;
} cfg;

static struct gs_job_region *R;  /* the job region; NULL in pass-through */
static struct gs_gpu_region *G;  /* the node's GPU activity region; NULL when it could not be mapped */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* This process's slot; reset in a forked child (it has a PID, and allocations, of its own). */
static int g_slot = -1;
static pid_t g_slot_pid;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static bool parse_u64(const char *text, uint64_t *out) {
    if (!text || !*text) return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end || text[0] == '-') return false;
    *out = v;
    return true;
}

static int parse_priority(const char *text) {
    static const char *names[] = {"idle", "low", "normal", "high", "realtime"};
    if (!text || !*text) return 2;
    for (int i = 0; i < GS_PRIORITIES; i++)
        if (strcasecmp(text, names[i]) == 0) return i;
    return -1;
}

/* /proc/<pid>/stat: field 3 (state) and 22 (starttime). False when the process is gone. */
static bool proc_stat(pid_t pid, char *state, uint64_t *start_ticks) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p || p[1] != ' ') return false;
    p += 2;
    *state = *p;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p) return false;
        p++;
    }
    *start_ticks = strtoull(p, NULL, 10);
    return true;
}

static bool slot_alive(const struct gs_proc *s) {
    char state;
    uint64_t ticks;
    if (!proc_stat(s->pid, &state, &ticks)) return false;
    return state != 'Z' && state != 'X' && ticks == s->start_ticks;
}

/* Map ``path`` (created and initialised under flock when new); NULL and a reason when it cannot be. */
static void *map_region(const char *path, size_t size, uint64_t magic, void (*init)(void *), const char **why) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0660);
    if (fd < 0) {
        *why = strerror(errno);
        return NULL;
    }
    void *mem = MAP_FAILED;
    if (flock(fd, LOCK_EX) != 0) {
        *why = strerror(errno);
        close(fd);
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || ((size_t)st.st_size < size && ftruncate(fd, (off_t)size) != 0)) {
        *why = strerror(errno);
        goto out;
    }
    mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) {
        *why = strerror(errno);
        goto out;
    }
    uint64_t seen = __atomic_load_n((uint64_t *)mem, __ATOMIC_ACQUIRE);
    if (seen == 0) {
        init(mem);
        __atomic_store_n((uint64_t *)mem, magic, __ATOMIC_RELEASE);
    } else if (seen != magic || ((uint32_t *)mem)[2] != GS_VERSION) {
        *why = "it was made by another version of the shim";
        munmap(mem, size);
        mem = MAP_FAILED;
    }
out:
    flock(fd, LOCK_UN);
    close(fd);
    return mem == MAP_FAILED ? NULL : mem;
}

static uint64_t env_limit;
static int64_t env_host_gpus[GS_MAX_DEVICES];
static uint32_t env_devices;

static void init_job_region(void *mem) {
    struct gs_job_region *r = mem;
    r->version = GS_VERSION;
    r->size = sizeof *r;
    r->devices = env_devices;
    r->compute_percent = cfg.compute_percent;
    r->priority = cfg.priority;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->created_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&r->lock.mutex, &a);
    pthread_mutexattr_destroy(&a);
    uint64_t now = now_ns();
    for (int d = 0; d < GS_MAX_DEVICES; d++) {
        r->dev[d].limit_bytes = env_limit;
        r->dev[d].host_gpu = env_host_gpus[d];
        r->dev[d].tokens_ns = (int64_t)(cfg.burst_ns * cfg.compute_percent / 100);
        r->dev[d].refill_ns = now;
    }
}

static void init_gpu_region(void *mem) {
    struct gs_gpu_region *g = mem;
    g->version = GS_VERSION;
    g->size = sizeof *g;
}

static void after_fork_child(void);

static void shim_init_once(void) {
    resolve_missing();
    pthread_atfork(NULL, NULL, after_fork_child);

    /* configuration: everything is checked before anything is used */
    const char *problem = NULL;
    char region_path[4096] = "";
    const char *region = getenv("GPUSLICE_SHIM_REGION");
    const char *dir = getenv("GPUSLICE_SHIM_DIR");
    const char *job = getenv("GPUSLICE_JOB_ID");
    if (region && *region)
        snprintf(region_path, sizeof region_path, "%s", region);
    else if (dir && *dir && job && *job && !strchr(job, '/'))
        snprintf(region_path, sizeof region_path, "%s/%s.region", dir, job);
    else
        problem = "GPUSLICE_SHIM_REGION (or GPUSLICE_SHIM_DIR and GPUSLICE_JOB_ID) is not set";

    uint64_t percent = 100, v;
    const char *text = getenv("GPUSLICE_GPU_MEMORY_BYTES");
    if (!problem && !parse_u64(text, &env_limit))
        problem = "GPUSLICE_GPU_MEMORY_BYTES is not a whole number of bytes";
    text = getenv("GPUSLICE_COMPUTE_PERCENT");
    if (!problem && text && (!parse_u64(text, &percent) || percent < 1 || percent > 100))
        problem = "GPUSLICE_COMPUTE_PERCENT is not an integer from 1 to 100";
    cfg.compute_percent = (uint32_t)percent;
    cfg.priority = parse_priority(getenv("GPUSLICE_PRIORITY"));
    if (!problem && cfg.priority < 0)
        problem = "GPUSLICE_PRIORITY is not one of idle, low, normal, high, realtime";
    cfg.active_window_ns = 100000000ull; /* a high job is "active" for 100 ms after a launch */
    if (parse_u64(getenv("GPUSLICE_SHIM_ACTIVE_MS"), &v)) cfg.active_window_ns = v * 1000000ull;
    cfg.burst_ns = 20000000ull; /* 20 ms of whole-GPU time: short bursts, shares hold over ~100 ms */
    if (parse_u64(getenv("GPUSLICE_SHIM_BURST_MS"), &v) && v > 0) cfg.burst_ns = v * 1000000ull;

    for (int d = 0; d < GS_MAX_DEVICES; d++) env_host_gpus[d] = -1;
    text = getenv("GPUSLICE_GPUS");
    for (const char *p = text; !problem && p && *p && env_devices < GS_MAX_DEVICES;) {
        char *end;
        long g = strtol(p, &end, 10);
        if (end == p || g < 0 || g >= GS_MAX_HOST_GPUS || (*end && *end != ',')) {
            problem = "GPUSLICE_GPUS is not a comma-separated list of GPU indices";
            break;
        }
        env_host_gpus[env_devices++] = g;
        p = *end ? end + 1 : end;
    }
    if (env_devices == 0) env_devices = 1;
    text = getenv("GPUSLICE_GPU_UUIDS");
    for (const char *p = text; p && *p && cfg.nuuids < GS_MAX_DEVICES;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n < NVML_DEVICE_UUID_V2_BUFFER_SIZE) memcpy(cfg.uuids[cfg.nuuids], p, n);
        cfg.nuuids++;
        p = end ? end + 1 : p + n;
    }

    const char *why = NULL;
    if (!problem) {
        R = map_region(region_path, sizeof *R, GS_JOB_MAGIC, init_job_region, &why);
        if (!R) {
            static char msg[4400];
            snprintf(msg, sizeof msg, "cannot use the job region %s (%s)", region_path, why);
            problem = msg;
        }
    }
    if (problem) {
        warn_once("%s; running without GPU limits", problem);
        return;
    }
    char gpu_path[4200];
    const char *gpu_region = getenv("GPUSLICE_SHIM_GPU_REGION");
    if (gpu_region && *gpu_region) {
        snprintf(gpu_path, sizeof gpu_path, "%s", gpu_region);
    } else {
        snprintf(gpu_path, sizeof gpu_path, "%s", region_path);
        char *slash = strrchr(gpu_path, '/');
        snprintf(slash ? slash + 1 : gpu_path, sizeof gpu_path - (size_t)(slash ? slash + 1 - gpu_path : 0),
                 "gpus.region");
    }
    G = map_region(gpu_path, sizeof *G, GS_GPU_MAGIC, init_gpu_region, &why);
    if (!G && cfg.priority < GS_PRIORITY_HIGH) /* priorities need it; limits do not */
        warn_once("cannot use the GPU region %s (%s); this job will not yield to high-priority jobs",
                  gpu_path, why);
    cfg.enforce = true;
}

static inline bool shim_init(void) {
    pthread_once(&g_once, shim_init_once);
    return cfg.enforce;
}

/* ---- the job lock and memory accounting ------------------------------------------------------------ */

static bool job_lock(void) {
    int rc = pthread_mutex_lock(&R->lock.mutex);
    if (rc == EOWNERDEAD) {
        /* The holder died inside the lock. Every update it made is one aligned store to its own slot
         * or to a bucket counter, and totals are sums computed under the lock, so the state is whole. */
        pthread_mutex_consistent(&R->lock.mutex);
        return true;
    }
    if (rc != 0) warn_once("the job region's lock failed (%s); running without GPU limits", strerror(rc));
    return rc == 0;
}

static void job_unlock(void) { pthread_mutex_unlock(&R->lock.mutex); }

static uint64_t used_locked(int dev) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < R->proc_hwm && i < GS_MAX_PROCS; i++)
        if (R->proc[i].pid) total += R->proc[i].used[dev];
    return total;
}

/* Free the slots of processes that are gone (killed, crashed, exited without freeing). */
static void reclaim_locked(void) {
    for (uint32_t i = 0; i < R->proc_hwm && i < GS_MAX_PROCS; i++) {
        struct gs_proc *s = &R->proc[i];
        if (s->pid && (int)i != g_slot && !slot_alive(s)) {
            memset(s->used, 0, sizeof s->used);
            __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
        }
    }
}

/* This process's slot, taken under the lock on first use. -1 when all are held by live processes. */
static int slot_locked(void) {
    pid_t pid = getpid();
    if (g_slot >= 0 && g_slot_pid == pid) return g_slot;
    char state;
    uint64_t ticks = 0;
    proc_stat(pid, &state, &ticks);
    int free_slot = -1;
    for (int pass = 0; pass < 2 && free_slot < 0; pass++) {
        if (pass == 1) reclaim_locked();
        for (int i = 0; i < GS_MAX_PROCS; i++) {
            struct gs_proc *s = &R->proc[i];
            /* Our own PID and start time: this process before an exec. Its CUDA memory went with the
             * old image, so the slot starts from zero again. */
            if (s->pid == pid && s->start_ticks == ticks) {
                free_slot = i;
                break;
            }
            if (s->pid == 0 && free_slot < 0) free_slot = i;
        }
    }
    if (free_slot < 0) return -1;
    struct gs_proc *s = &R->proc[free_slot];
    memset(s->used, 0, sizeof s->used);
    s->start_ticks = ticks;
    __atomic_store_n(&s->pid, pid, __ATOMIC_RELEASE);
    if ((uint32_t)free_slot >= R->proc_hwm) R->proc_hwm = (uint32_t)free_slot + 1;
    g_slot = free_slot;
    g_slot_pid = pid;
    return free_slot;
}

/* Count ``bytes`` on ``dev`` for this process if the job stays within its limit. */
static CUresult reserve(int dev, uint64_t bytes) {
    if (dev < 0 || dev >= GS_MAX_DEVICES || !job_lock()) return CUDA_SUCCESS; /* not fenced: docs/shim.md */
    int slot = slot_locked();
    CUresult rc = CUDA_SUCCESS;
    uint64_t limit = R->dev[dev].limit_bytes;
    if (slot < 0) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (limit) {
        uint64_t used = used_locked(dev);
        if (used + bytes > limit || used + bytes < used) {
            reclaim_locked();
            used = used_locked(dev);
        }
        if (used + bytes > limit || used + bytes < used) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
            /* atomic although under the lock: readers (the node's metrics) take no lock */
            __atomic_add_fetch(&R->dev[dev].oom_refusals, 1, __ATOMIC_RELAXED);
        }
    }
    if (rc == CUDA_SUCCESS) R->proc[slot].used[dev] += bytes;
    job_unlock();
    if (slot < 0) warn_once("all %d process slots of the job region are taken; allocation refused", GS_MAX_PROCS);
    return rc;
}

static void release(int dev, uint64_t bytes) {
    if (dev < 0 || dev >= GS_MAX_DEVICES || !job_lock()) return;
    int slot = slot_locked();
    if (slot >= 0) {
        uint64_t *u = &R->proc[slot].used[dev];
        *u = *u > bytes ? *u - bytes : 0;
    }
    job_unlock();
}

/* ---- what this process allocated: key -> (bytes, device) --------------------------------------- */

enum { KIND_PTR = 1, KIND_VMM = 2, KIND_ARRAY = 3, KIND_MIPMAP = 4 };
struct alloc {
    uint64_t key;
    uint64_t bytes;
    int32_t dev;
    uint8_t kind;
    uint8_t state; /* 0 empty, 1 used, 2 deleted */
};
static struct {
    pthread_mutex_t lock;
    struct alloc *slots;
    size_t cap, used, filled; /* filled counts used + deleted */
} T = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 0};

static size_t hash_key(uint64_t key, uint8_t kind) {
    uint64_t h = (key ^ ((uint64_t)kind << 56)) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 29));
}

static struct alloc *find_locked(uint64_t key, uint8_t kind) {
    if (!T.cap) return NULL;
    for (size_t i = hash_key(key, kind) & (T.cap - 1);; i = (i + 1) & (T.cap - 1)) {
        struct alloc *a = &T.slots[i];
        if (a->state == 0) return NULL;
        if (a->state == 1 && a->key == key && a->kind == kind) return a;
    }
}

static bool grow_locked(void) {
    size_t cap = T.cap ? T.cap * 2 : 1024;
    struct alloc *slots = calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < T.cap; i++) {
        struct alloc *a = &T.slots[i];
        if (a->state != 1) continue;
        size_t j = hash_key(a->key, a->kind) & (cap - 1);
        while (slots[j].state) j = (j + 1) & (cap - 1);
        slots[j] = *a;
    }
    free(T.slots);
    T.slots = slots;
    T.cap = cap;
    T.filled = T.used;
    return true;
}

static bool track(uint64_t key, uint8_t kind, uint64_t bytes, int dev) {
    pthread_mutex_lock(&T.lock);
    bool ok = true;
    if ((T.filled + 1) * 2 > T.cap) ok = grow_locked();
    if (ok) {
        size_t i = hash_key(key, kind) & (T.cap - 1);
        while (T.slots[i].state == 1) i = (i + 1) & (T.cap - 1);
        if (T.slots[i].state == 0) T.filled++;
        T.slots[i] = (struct alloc){key, bytes, dev, kind, 1};
        T.used++;
    }
    pthread_mutex_unlock(&T.lock);
    return ok;
}

/* Remove and return an allocation; false when this process did not make it through the shim. */
static bool untrack(uint64_t key, uint8_t kind, struct alloc *out) {
    pthread_mutex_lock(&T.lock);
    struct alloc *a = find_locked(key, kind);
    if (a) {
        *out = *a;
        a->state = 2;
        T.used--;
    }
    pthread_mutex_unlock(&T.lock);
    return a != NULL;
}

static int current_device(void) {
    CUdevice dev;
    if (!r_cuCtxGetDevice || r_cuCtxGetDevice(&dev) != CUDA_SUCCESS) return -1;
    return dev;
}

/* The common shape of an allocation hook: reserve, allocate, keep or give back. */
#define ALLOCATE(kind, dev, bytes, key_expr, call)              \
    do {                                                        \
        int dev_ = (dev);                                       \
        uint64_t bytes_ = (bytes);                              \
        CUresult rc_ = reserve(dev_, bytes_);                   \
        if (rc_ != CUDA_SUCCESS) return rc_;                    \
        rc_ = (call);                                           \
        if (rc_ == CUDA_SUCCESS)                                \
            track((uint64_t)(key_expr), (kind), bytes_, dev_);  \
        else                                                    \
            release(dev_, bytes_);                              \
        return rc_;                                             \
    } while (0)

#define FREE(kind, key, call)                                   \
    do {                                                        \
        CUresult rc_ = (call);                                  \
        struct alloc a_;                                        \
        if (rc_ == CUDA_SUCCESS && untrack((uint64_t)(key), (kind), &a_)) release(a_.dev, a_.bytes); \
        return rc_;                                             \
    } while (0)

#define REAL_OR_FAIL(name)                          \
    if (!r_##name) resolve_missing();               \
    if (!r_##name) return CUDA_ERROR_NOT_INITIALIZED

/* ---- memory hooks --------------------------------------------------------------------------------- */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    bool on = shim_init();
    REAL_OR_FAIL(cuMemAlloc_v2);
    if (!on || !dptr) return r_cuMemAlloc_v2(dptr, bytes);
    ALLOCATE(KIND_PTR, current_device(), bytes, *dptr, r_cuMemAlloc_v2(dptr, bytes));
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags) {
    bool on = shim_init();
    REAL_OR_FAIL(cuMemAllocManaged);
    if (!on || !dptr) return r_cuMemAllocManaged(dptr, bytes, flags);
    ALLOCATE(KIND_PTR, current_device(), bytes, *dptr, r_cuMemAllocManaged(dptr, bytes, flags));
}

#define ALLOC_ASYNC(name)                                                                  \
    EXPORT CUresult name(CUdeviceptr *dptr, size_t bytes, CUstream stream) {               \
        bool on = shim_init();                                                             \
        REAL_OR_FAIL(name);                                                                \
        if (!on || !dptr) return r_##name(dptr, bytes, stream);                            \
        ALLOCATE(KIND_PTR, current_device(), bytes, *dptr, r_##name(dptr, bytes, stream)); \
    }
ALLOC_ASYNC(cuMemAllocAsync)
ALLOC_ASYNC(cuMemAllocAsync_ptsz)

#define ALLOC_POOL(name)                                                                         \
    EXPORT CUresult name(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {  \
        bool on = shim_init();                                                                   \
        REAL_OR_FAIL(name);                                                                      \
        if (!on || !dptr) return r_##name(dptr, bytes, pool, stream);                            \
        ALLOCATE(KIND_PTR, current_device(), bytes, *dptr, r_##name(dptr, bytes, pool, stream)); \
    }
ALLOC_POOL(cuMemAllocFromPoolAsync)
ALLOC_POOL(cuMemAllocFromPoolAsync_ptsz)

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned int element_bytes) {
    bool on = shim_init();
    REAL_OR_FAIL(cuMemAllocPitch_v2);
    if (!on || !dptr || !pitch) return r_cuMemAllocPitch_v2(dptr, pitch, width, height, element_bytes);
    /* The pitch is known only afterwards: reserve the most it can be, then settle on the real size. */
    int dev = current_device();
    uint64_t most = ((uint64_t)width + PITCH_ALIGN_BYTES - 1) / PITCH_ALIGN_BYTES * PITCH_ALIGN_BYTES * height;
    CUresult rc = reserve(dev, most);
    if (rc != CUDA_SUCCESS) return rc;
    rc = r_cuMemAllocPitch_v2(dptr, pitch, width, height, element_bytes);
    if (rc != CUDA_SUCCESS) {
        release(dev, most);
        return rc;
    }
    uint64_t bytes = (uint64_t)*pitch * height;
    if (bytes < most) {
        release(dev, most - bytes);
    } else if (bytes > most && reserve(dev, bytes - most) != CUDA_SUCCESS) {
        if (r_cuMemFree_v2) r_cuMemFree_v2(*dptr);
        release(dev, most);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    track(*dptr, KIND_PTR, bytes, dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    bool on = shim_init();
    REAL_OR_FAIL(cuMemFree_v2);
    if (!on) return r_cuMemFree_v2(dptr);
    FREE(KIND_PTR, dptr, r_cuMemFree_v2(dptr));
}

#define FREE_ASYNC(name)                                      \
    EXPORT CUresult name(CUdeviceptr dptr, CUstream stream) { \
        bool on = shim_init();                                \
        REAL_OR_FAIL(name);                                   \
        if (!on) return r_##name(dptr, stream);               \
        FREE(KIND_PTR, dptr, r_##name(dptr, stream));         \
    }
FREE_ASYNC(cuMemFreeAsync)
FREE_ASYNC(cuMemFreeAsync_ptsz)

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    bool on = shim_init();
    REAL_OR_FAIL(cuMemCreate);
    /* Only device memory counts; host and host-NUMA locations are the host's memory. */
    if (!on || !handle || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return r_cuMemCreate(handle, bytes, prop, flags);
    ALLOCATE(KIND_VMM, prop->location.id, bytes, *handle, r_cuMemCreate(handle, bytes, prop, flags));
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    bool on = shim_init();
    REAL_OR_FAIL(cuMemRelease);
    if (!on) return r_cuMemRelease(handle);
    FREE(KIND_VMM, handle, r_cuMemRelease(handle));
}

/* Bytes per channel element of a CUarray_format; 4 for formats this table does not know (an estimate,
 * as is the whole array size: the driver's padding and tiling are not visible to us). */
static uint64_t format_bytes(CUarray_format f) {
    switch (f) {
    case 0x01: case 0x08: return 1; /* (un)signed int8 */
    case 0x02: case 0x09: case 0x10: return 2; /* (un)signed int16, half */
    default: return 4; /* (un)signed int32, float, others */
    }
}

static uint64_t max1(size_t v) { return v ? v : 1; }

EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *d) {
    bool on = shim_init();
    REAL_OR_FAIL(cuArrayCreate_v2);
    if (!on || !array || !d) return r_cuArrayCreate_v2(array, d);
    uint64_t bytes = (uint64_t)d->Width * max1(d->Height) * max1(d->NumChannels) * format_bytes(d->Format);
    ALLOCATE(KIND_ARRAY, current_device(), bytes, (uintptr_t)*array, r_cuArrayCreate_v2(array, d));
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    bool on = shim_init();
    REAL_OR_FAIL(cuArray3DCreate_v2);
    if (!on || !array || !d) return r_cuArray3DCreate_v2(array, d);
    uint64_t bytes = (uint64_t)d->Width * max1(d->Height) * max1(d->Depth) * max1(d->NumChannels) *
                     format_bytes(d->Format);
    ALLOCATE(KIND_ARRAY, current_device(), bytes, (uintptr_t)*array, r_cuArray3DCreate_v2(array, d));
}

EXPORT CUresult cuArrayDestroy(CUarray array) {
    bool on = shim_init();
    REAL_OR_FAIL(cuArrayDestroy);
    if (!on) return r_cuArrayDestroy(array);
    FREE(KIND_ARRAY, (uintptr_t)array, r_cuArrayDestroy(array));
}

/* Every level halves each dimension (never below 1), down to ``levels`` levels. */
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    bool on = shim_init();
    REAL_OR_FAIL(cuMipmappedArrayCreate);
    if (!on || !array || !d) return r_cuMipmappedArrayCreate(array, d, levels);
    uint64_t bytes = 0, w = max1(d->Width), h = max1(d->Height), z = max1(d->Depth);
    for (unsigned int level = 0; level < (levels ? levels : 1); level++) {
        bytes += w * h * z;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : 1;
        z = z > 1 ? z / 2 : 1;
    }
    bytes *= max1(d->NumChannels) * format_bytes(d->Format);
    ALLOCATE(KIND_MIPMAP, current_device(), bytes, (uintptr_t)*array, r_cuMipmappedArrayCreate(array, d, levels));
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array) {
    bool on = shim_init();
    REAL_OR_FAIL(cuMipmappedArrayDestroy);
    if (!on) return r_cuMipmappedArrayDestroy(array);
    FREE(KIND_MIPMAP, (uintptr_t)array, r_cuMipmappedArrayDestroy(array));
}

/* (total, free) as the job sees device slot ``dev``: the slice, less what the job holds. */
static void slice_view(int dev, uint64_t real_total, uint64_t real_free, uint64_t *total, uint64_t *free_,
                       uint64_t *used) {
    *total = real_total;
    *free_ = real_free;
    *used = real_total - real_free;
    if (dev < 0 || dev >= GS_MAX_DEVICES || !job_lock()) return;
    reclaim_locked();
    uint64_t limit = R->dev[dev].limit_bytes, held = used_locked(dev);
    job_unlock();
    if (!limit) return;
    *total = limit < real_total ? limit : real_total;
    uint64_t left = *total > held ? *total - held : 0;
    *free_ = left < real_free ? left : real_free;
    *used = held;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    bool on = shim_init();
    REAL_OR_FAIL(cuMemGetInfo_v2);
    CUresult rc = r_cuMemGetInfo_v2(free_bytes, total_bytes);
    if (rc != CUDA_SUCCESS || !on || !free_bytes || !total_bytes) return rc;
    uint64_t total, free_, used;
    slice_view(current_device(), *total_bytes, *free_bytes, &total, &free_, &used);
    *total_bytes = total;
    *free_bytes = free_;
    return rc;
}

/* NVML names devices by handle and counts them on the host: the UUID says which of the job's it is. */
static int nvml_slot(nvmlDevice_t device) {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = "";
    if (!r_nvmlDeviceGetUUID || r_nvmlDeviceGetUUID(device, uuid, sizeof uuid) != NVML_SUCCESS) return -1;
    for (int i = 0; i < cfg.nuuids; i++)
        if (strcmp(uuid, cfg.uuids[i]) == 0) return i;
    return -1;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    bool on = shim_init();
    if (!r_nvmlDeviceGetMemoryInfo) resolve_missing();
    if (!r_nvmlDeviceGetMemoryInfo) return NVML_ERROR_NOT_FOUND;
    nvmlReturn_t rc = r_nvmlDeviceGetMemoryInfo(device, memory);
    int slot;
    if (rc != NVML_SUCCESS || !on || !memory || (slot = nvml_slot(device)) < 0) return rc;
    uint64_t total, free_, used;
    slice_view(slot, memory->total, memory->free, &total, &free_, &used);
    memory->total = total;
    memory->free = free_;
    memory->used = used;
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    bool on = shim_init();
    if (!r_nvmlDeviceGetMemoryInfo_v2) resolve_missing();
    if (!r_nvmlDeviceGetMemoryInfo_v2) return NVML_ERROR_NOT_FOUND;
    nvmlReturn_t rc = r_nvmlDeviceGetMemoryInfo_v2(device, memory);
    int slot;
    if (rc != NVML_SUCCESS || !on || !memory || (slot = nvml_slot(device)) < 0) return rc;
    uint64_t total, free_, used;
    slice_view(slot, memory->total, memory->free, &total, &free_, &used);
    memory->total = total;
    memory->used = used;
    memory->free = total > used + memory->reserved ? total - used - memory->reserved : 0;
    return rc;
}

/* ---- compute: priorities and the token bucket ---------------------------------------------------- */

enum { PENDING_FREE, PENDING_TAKEN, PENDING_RECORDED };
static struct {
    pthread_mutex_t lock;
    struct pending {
        CUevent start, end;
        CUcontext ctx;
        int dev;
        int state; /* PENDING_FREE, _TAKEN (a launch is between its two events), _RECORDED */
    } slot[PENDING_SLOTS];
} P = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void charge(int dev, uint64_t ns) {
    if (!job_lock()) return;
    R->dev[dev].tokens_ns -= (int64_t)ns;
    R->dev[dev].busy_ns += ns;
    job_unlock();
}

static void charge_slot(struct pending *p) {
    float ms = 0;
    if (r_cuEventElapsedTime(&ms, p->start, p->end) == CUDA_SUCCESS && ms > 0)
        charge(p->dev, (uint64_t)((double)ms * 1e6));
    p->state = PENDING_FREE;
}

/* Charge the kernels whose end event has completed; with ``wait``, wait for the first still running. */
static void harvest_locked(bool wait) {
    int running = -1;
    for (int i = 0; i < PENDING_SLOTS; i++) {
        struct pending *p = &P.slot[i];
        if (p->state != PENDING_RECORDED) continue;
        CUresult q = r_cuEventQuery(p->end);
        if (q == CUDA_ERROR_NOT_READY) {
            if (running < 0) running = i;
        } else if (q == CUDA_SUCCESS) {
            charge_slot(p);
        } else {
            p->state = PENDING_FREE; /* its context is gone: nothing to measure */
        }
    }
    if (wait && running >= 0) {
        struct pending *p = &P.slot[running];
        if (r_cuEventSynchronize(p->end) == CUDA_SUCCESS)
            charge_slot(p);
        else
            p->state = PENDING_FREE;
    }
}

static int free_pending_locked(void) {
    for (int i = 0; i < PENDING_SLOTS; i++)
        if (P.slot[i].state == PENDING_FREE) return i;
    return -1;
}

/* A measuring slot whose events belong to the current context, or -1 (then the launch is not measured). */
static int take_pending(int dev) {
    CUcontext ctx = NULL;
    if (!r_cuEventCreate || !r_cuEventDestroy || !r_cuEventRecord || !r_cuEventQuery || !r_cuEventSynchronize ||
        !r_cuEventElapsedTime || !r_cuCtxGetCurrent || r_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
        return -1;
    pthread_mutex_lock(&P.lock);
    harvest_locked(false);
    int slot = free_pending_locked();
    if (slot < 0) { /* PENDING_SLOTS kernels in flight: wait for the oldest we know of */
        harvest_locked(true);
        slot = free_pending_locked();
    }
    if (slot >= 0) {
        struct pending *p = &P.slot[slot];
        if (p->start && p->ctx != ctx) {
            r_cuEventDestroy(p->start);
            r_cuEventDestroy(p->end);
            p->start = p->end = NULL;
        }
        if (!p->start && (r_cuEventCreate(&p->start, 0) != CUDA_SUCCESS ||
                          r_cuEventCreate(&p->end, 0) != CUDA_SUCCESS)) {
            p->start = p->end = NULL;
            slot = -1;
        } else {
            p->ctx = ctx;
            p->dev = dev;
            p->state = PENDING_TAKEN;
        }
    }
    pthread_mutex_unlock(&P.lock);
    return slot;
}

static void put_pending(int slot, bool recorded) {
    pthread_mutex_lock(&P.lock);
    P.slot[slot].state = recorded ? PENDING_RECORDED : PENDING_FREE;
    harvest_locked(false);
    pthread_mutex_unlock(&P.lock);
}

struct launch {
    int dev;
    int pending; /* measuring slot, -1 when this launch is not measured */
    CUstream stream;
};

static bool higher_priority_active(int host_gpu, uint64_t now) {
    for (int p = GS_PRIORITY_HIGH; p < GS_PRIORITIES; p++) {
        uint64_t last = __atomic_load_n(&G->last_launch_ns[host_gpu][p], __ATOMIC_RELAXED);
        if (last && now - last < cfg.active_window_ns) return true;
    }
    return false;
}

/* Wait as the job's priority and share require, then start measuring. */
static struct launch before_launch(CUstream stream) {
    struct launch l = {-1, -1, stream};
    if (!shim_init()) return l;
    int dev = current_device();
    if (dev < 0 || dev >= GS_MAX_DEVICES) return l;
    l.dev = dev;
    if (r_cuStreamIsCapturing) {
        CUstreamCaptureStatus status = 0;
        if (r_cuStreamIsCapturing(stream, &status) == CUDA_SUCCESS && status != 0) return l; /* recorded, not run */
    }
    int64_t host = R->dev[dev].host_gpu;
    /* the region's priority and share, as written by the job's first process: a child cannot raise
     * its own by changing its environment */
    int priority = R->priority >= 0 && R->priority < GS_PRIORITIES ? R->priority : 0;
    uint64_t waited = 0, t0 = now_ns();
    if (G && host >= 0 && host < GS_MAX_HOST_GPUS) {
        if (priority >= GS_PRIORITY_HIGH) {
            __atomic_store_n(&G->last_launch_ns[host][priority], t0, __ATOMIC_RELAXED);
        } else {
            while (higher_priority_active((int)host, now_ns())) sleep_ns(1000000);
        }
    }
    bool throttled = priority < GS_PRIORITY_HIGH && R->compute_percent < 100;
    if (throttled) {
        for (;;) {
            if (!job_lock()) break;
            struct gs_device *d = &R->dev[dev];
            uint64_t now = now_ns();
            int64_t cap = (int64_t)(cfg.burst_ns * R->compute_percent / 100);
            if (now > d->refill_ns) {
                int64_t add = (int64_t)((now - d->refill_ns) * R->compute_percent / 100);
                d->tokens_ns = d->tokens_ns + add > cap ? cap : d->tokens_ns + add;
                d->refill_ns = now;
            }
            int64_t debt = d->tokens_ns;
            job_unlock();
            if (debt >= 0) break;
            uint64_t wait = (uint64_t)(-debt) * 100 / R->compute_percent;
            sleep_ns(wait < 50000000ull ? wait : 50000000ull);
        }
        l.pending = take_pending(dev);
        if (l.pending >= 0 && r_cuEventRecord(P.slot[l.pending].start, stream) != CUDA_SUCCESS) {
            put_pending(l.pending, false);
            l.pending = -1;
        }
    }
    /* counters only: atomic adds, no lock on the launch path */
    __atomic_fetch_add(&R->dev[dev].launches, 1, __ATOMIC_RELAXED);
    waited = now_ns() - t0;
    if (waited > 1000000) /* over 1 ms: a wait, not overhead */
        __atomic_fetch_add(&R->dev[dev].throttled_ns, waited, __ATOMIC_RELAXED);
    return l;
}

static CUresult after_launch(struct launch l, CUresult rc) {
    if (l.pending >= 0) {
        bool recorded = rc == CUDA_SUCCESS && r_cuEventRecord(P.slot[l.pending].end, l.stream) == CUDA_SUCCESS;
        put_pending(l.pending, recorded);
    }
    return rc;
}

#define LAUNCH_KERNEL(name)                                                                                   \
    EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,    \
                         unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params, \
                         void **extra) {                                                                      \
        struct launch l = before_launch(stream);                                                              \
        REAL_OR_FAIL(name);                                                                                   \
        return after_launch(l, r_##name(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra));          \
    }
LAUNCH_KERNEL(cuLaunchKernel)
LAUNCH_KERNEL(cuLaunchKernel_ptsz)

#define LAUNCH_COOPERATIVE(name)                                                                              \
    EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,    \
                         unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params) { \
        struct launch l = before_launch(stream);                                                              \
        REAL_OR_FAIL(name);                                                                                   \
        return after_launch(l, r_##name(f, gx, gy, gz, bx, by, bz, shared, stream, params));                 \
    }
LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel)
LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel_ptsz)

#define LAUNCH_EX(name)                                                                              \
    EXPORT CUresult name(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {  \
        struct launch l = before_launch(config ? config->hStream : NULL);                            \
        REAL_OR_FAIL(name);                                                                          \
        return after_launch(l, r_##name(config, f, params, extra));                                  \
    }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

#define GRAPH_LAUNCH(name)                                             \
    EXPORT CUresult name(CUgraphExec graph, CUstream stream) {         \
        struct launch l = before_launch(stream);                       \
        REAL_OR_FAIL(name);                                            \
        return after_launch(l, r_##name(graph, stream));               \
    }
GRAPH_LAUNCH(cuGraphLaunch)
GRAPH_LAUNCH(cuGraphLaunch_ptsz)

static void after_fork_child(void) {
    /* The child shares no CUDA context and owns none of the parent's allocations; it takes its own
     * slot on its first allocation. The lock may have been held by another parent thread. */
    pthread_mutex_init(&T.lock, NULL);
    free(T.slots);
    T.slots = NULL;
    T.cap = T.used = T.filled = 0;
    g_slot = -1;
    memset(&P, 0, sizeof P); /* the parent's events belong to contexts the child does not have */
    pthread_mutex_init(&P.lock, NULL);
}

/* ---- the ways in: cuGetProcAddress and dlsym --------------------------------------------------------- */

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    shim_init();
    REAL_OR_FAIL(cuGetProcAddress);
    CUresult rc = r_cuGetProcAddress(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS && pfn) *pfn = substitute(*pfn);
    return rc;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    shim_init();
    REAL_OR_FAIL(cuGetProcAddress_v2);
    CUresult rc = r_cuGetProcAddress_v2(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS && pfn) *pfn = substitute(*pfn);
    return rc;
}

static bool is_driver_symbol(const char *name) {
    return name && ((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0);
}

/* dlsym(RTLD_NEXT, name) as the caller would have got it: the first definition in an object loaded
 * after the caller's. Asking the real dlsym from here would search after *this* library instead, and
 * hand an interposer loaded after us its own function back (endless recursion in its wrapper). */
static void *next_after(void *caller, const char *name) {
    dlsym_fn sym = real_dlsym();
    Dl_info who;
    struct link_map *map = NULL;
    void *self = dlopen(NULL, RTLD_LAZY | RTLD_NOLOAD);
    bool usable = caller && dladdr(caller, &who) && self && dlinfo(self, RTLD_DI_LINKMAP, &map) == 0 && map;
    if (self) dlclose(self);
    if (!usable) return sym(RTLD_NEXT, name);
    bool after = false;
    void *found = NULL;
    for (struct link_map *m = map; m && !found; m = m->l_next) {
        Dl_info obj;
        if (!dladdr(m->l_ld, &obj)) continue;
        if (after) {
            /* NOLOAD handles only add a reference to a loaded object: each is dropped again */
            void *handle = dlopen(m->l_name && *m->l_name ? m->l_name : NULL, RTLD_LAZY | RTLD_NOLOAD);
            void *p = handle ? sym(handle, name) : NULL;
            Dl_info def;
            if (p && dladdr(p, &def) && def.dli_fbase == obj.dli_fbase) found = p;
            if (handle) dlclose(handle);
        } else if (obj.dli_fbase == who.dli_fbase) {
            after = true;
        }
    }
    return found;
}

/* The one libc function the shim overrides: a handle lookup of a hooked driver symbol (how the CUDA
 * runtime, ctypes and many frameworks reach libcuda) returns the hook. Everything else is answered as
 * the real dlsym would answer the caller. */
EXPORT void *dlsym(void *handle, const char *name) {
    dlsym_fn sym = real_dlsym();
    if (!sym) return NULL;
    void *caller = __builtin_extract_return_addr(__builtin_return_address(0));
    void *p;
    if (handle == RTLD_NEXT) {
        p = next_after(caller, name);
    } else {
        p = sym(handle, name);
        if (!p && handle == RTLD_DEFAULT) { /* the caller's own scope (a library opened RTLD_LOCAL) */
            Dl_info who;
            void *own = caller && dladdr(caller, &who) ? dlopen(who.dli_fname, RTLD_LAZY | RTLD_NOLOAD) : NULL;
            if (own) {
                p = sym(own, name);
                dlclose(own);
            }
        }
    }
    if (p && is_driver_symbol(name)) {
        shim_init();
        p = substitute(p);
    }
    return p;
}
