/* The shared-memory regions of the gpuslice shim. Python reads them too (src/gpuslice/shim/region.py),
 * so the layout is fixed: explicit sizes, 8-byte aligned fields, little-endian x86-64 / aarch64.
 *
 * job region (one file per job, every process of the job maps it):
 *   0    u64 magic            GS_JOB_MAGIC; written last, after the rest is initialised
 *   8    u32 version          GS_VERSION
 *   12   u32 size             sizeof(struct gs_job_region)
 *   16   u32 devices          device slots in use (the job's visible GPUs)
 *   20   u32 compute_percent  1..100
 *   24   i32 priority         0 idle, 1 low, 2 normal, 3 high, 4 realtime (gpuslice's Priority)
 *   28   u32 proc_hwm         slots [0, proc_hwm) have been used
 *   32   u64 created_unix_ns
 *   64   pthread_mutex_t      process-shared, robust (64 bytes reserved)
 *   128  dev[16]            64 bytes each: limit, host_gpu, tokens, refill, busy, launches, throttled,
 *                           oom_refusals (was reserved and always 0: older regions read 0 refusals)
 *   1152 proc[256]          144 bytes each: pid, 0, start_ticks, used[16]
 *
 * gpu region (one file per node, every job's processes map it): per host GPU and priority, when a
 * kernel of that priority was last launched (CLOCK_MONOTONIC ns), so lower priorities can yield.
 */
#ifndef GPUSLICE_REGION_H
#define GPUSLICE_REGION_H

#include <pthread.h>
#include <stdint.h>

#define GS_JOB_MAGIC 0x31454349534c5347ULL /* "GSLICE1" */
#define GS_GPU_MAGIC 0x3155504749534c47ULL /* "GLSIGPU1" */
#define GS_VERSION 1u
#define GS_MAX_DEVICES 16
#define GS_MAX_PROCS 256
#define GS_MAX_HOST_GPUS 64
#define GS_PRIORITIES 5
#define GS_PRIORITY_HIGH 3

struct gs_device {
    uint64_t limit_bytes;   /* 0: no memory limit */
    int64_t host_gpu;       /* the host's GPU index of this slot, -1 when unknown */
    int64_t tokens_ns;      /* compute bucket: GPU time this job may still spend */
    uint64_t refill_ns;     /* CLOCK_MONOTONIC of the last refill */
    uint64_t busy_ns;       /* measured kernel time, all processes, since the region was made */
    uint64_t launches;      /* launches seen (kernels and graphs) */
    uint64_t throttled_ns;  /* time launches waited for tokens or for a higher priority */
    uint64_t oom_refusals;  /* allocations refused for the memory limit (not for a full process table) */
};

struct gs_proc {
    int32_t pid; /* 0: free */
    int32_t pad;
    uint64_t start_ticks; /* /proc/<pid>/stat starttime: a recycled PID is not the same process */
    uint64_t used[GS_MAX_DEVICES];
};

struct gs_job_region {
    uint64_t magic;
    uint32_t version;
    uint32_t size;
    uint32_t devices;
    uint32_t compute_percent;
    int32_t priority;
    uint32_t proc_hwm;
    uint64_t created_unix_ns;
    uint8_t reserved[24];
    union {
        pthread_mutex_t mutex;
        uint8_t bytes[64];
    } lock;
    struct gs_device dev[GS_MAX_DEVICES];
    struct gs_proc proc[GS_MAX_PROCS];
};

struct gs_gpu_region {
    uint64_t magic;
    uint32_t version;
    uint32_t size;
    uint8_t reserved[48];
    uint64_t last_launch_ns[GS_MAX_HOST_GPUS][GS_PRIORITIES];
};

_Static_assert(sizeof(pthread_mutex_t) <= 64, "the mutex must fit its 64 reserved bytes");
_Static_assert(sizeof(struct gs_device) == 64, "device slot layout");
_Static_assert(sizeof(struct gs_proc) == 144, "process slot layout");
_Static_assert(__builtin_offsetof(struct gs_job_region, lock) == 64, "lock offset");
_Static_assert(__builtin_offsetof(struct gs_job_region, dev) == 128, "device slots offset");
_Static_assert(__builtin_offsetof(struct gs_job_region, proc) == 1152, "process slots offset");
_Static_assert(__builtin_offsetof(struct gs_gpu_region, last_launch_ns) == 64, "gpu table offset");

#endif
