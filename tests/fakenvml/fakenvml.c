/*
 * fakenvml: a fake libnvidia-ml.so.1 for tests, loaded by the unmodified nvidia-ml-py.
 *
 * Build:  gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o DIR/libnvidia-ml.so.1 fakenvml.c
 *   -DFAKENVML_NO_MEMORY_V2    omit nvmlDeviceGetMemoryInfo_v2 (driver older than R510)
 *   -DFAKENVML_NO_PROCESS_V3   omit nvmlDeviceGet{Compute,Graphics}RunningProcesses_v3
 * A symbol that is not defined makes the binding raise NVMLError_FunctionNotFound, exactly as
 * an old driver does, so omitting a function is the whole "old driver" simulation.
 *
 * The GPUs live in a text file named by $FAKENVML_STATE, written by tests/fakenvml/state.py.
 * It is re-read (under a shared flock; writers take an exclusive one) on every call, so a test
 * can change the GPUs while a daemon polls them. Format, one record per line, '#' comments:
 *
 *   driver loaded=1 init_error=0 version=550.54.15
 *   gpu uuid=GPU-... total=BYTES other=BYTES reserved=BYTES util=PCT|na memutil=PCT lost=0|1 switch=N devutil=PCT minor=N name=REST OF LINE
 *   proc gpu=INDEX pid=PID used=BYTES reported=1|0 sm=PCT|na kind=compute|graphics|both start=TICKS every=N miss=M
 *
 * GPU lines are numbered 0.. in file order (that is the NVML index). `name=` must come last.
 * `minor=`: the card's /dev/nvidiaN number (nvmlDeviceGetMinorNumber), the index without it;
 * a real driver numbers cards by PCI order, which need not be NVML's.
 * As on a real driver a process's memory counts only while the process lives: a pid that is
 * gone, a zombie, or (when start= is given) a reused pid is left out of every answer.
 * used(v2) = other + sum(alive processes); v1 also counts `reserved` as used; free is the same.
 * Topology: GPUs with the same `switch=` share a PCIe switch (nvmlDeviceGetTopologyCommonAncestor
 * answers NVML_TOPOLOGY_SINGLE), others meet at the host bridge; with no switch= on either GPU
 * the call is NOT_SUPPORTED, as on a driver that cannot tell.
 *
 * Device and per-process utilization are separate figures on a real card: the device's is
 * the share of time any kernel ran (100 % when two busy jobs take turns), a process's is
 * its time slice, and a process may have no sample at all in a poll (FIELD.md). By default
 * the device reads util + its live processes' sm (capped at 100); `devutil=` sets the device
 * figure outright. `every=N miss=M`: in each run of N polls of
 * nvmlDeviceGetProcessUtilization on its GPU, the process has no sample in the first M
 * (every=6 miss=5: a sample in one poll of six; every=6 miss=1: none in one of six;
 * sm=na: never).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MAX_PROCS 1024
#define VALUE_NOT_AVAILABLE_ULL (~0ULL) /* the binding turns this into usedGpuMemory=None */
#define NA (-1)

/* Struct layouts exactly as pynvml.py defines them (natural C alignment matches ctypes). */
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24))) /* 0x02000028 */
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t; /* v2 and v3 share this layout */
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

/* A handle points into this array; its position is the NVML index. */
typedef struct nvmlDevice_st { int index; } *nvmlDevice_t;
static struct nvmlDevice_st devices[MAX_GPUS];

struct gpu {
    char uuid[96], name[96];
    unsigned long long total, other, reserved;
    int util, memutil, lost, pcie_switch, devutil; /* pcie_switch: -1 when not given; devutil NA: util + the processes' sm */
    int minor; /* -1 when not given: the index */
};
struct proc {
    int gpu, pid, reported, sm, kind, every, miss; /* kind bit 1 = compute, bit 2 = graphics */
    unsigned long long used, start;
};
struct state {
    int loaded, init_error, ngpus, nprocs;
    char version[64];
    struct gpu gpus[MAX_GPUS];
    struct proc procs[MAX_PROCS];
};

static int init_count; /* nvmlInit / nvmlShutdown nesting, as the real library counts it */

/* Value of `key=` in a line of space-separated tokens, or NULL. */
static const char *token(const char *line, const char *key) {
    size_t n = strlen(key);
    for (const char *p = line; (p = strstr(p, key)) != NULL; p += n)
        if ((p == line || p[-1] == ' ') && p[n] == '=') return p + n + 1;
    return NULL;
}
static unsigned long long num(const char *line, const char *key, unsigned long long dflt) {
    const char *v = token(line, key);
    return v ? strtoull(v, NULL, 10) : dflt;
}
static int pct(const char *line, const char *key, int dflt) {
    const char *v = token(line, key);
    if (!v) return dflt;
    return strncmp(v, "na", 2) == 0 ? NA : atoi(v);
}
static void copy_word(char *dst, size_t size, const char *src, int rest_of_line) {
    size_t n = 0;
    while (src && src[n] && src[n] != '\n' && (rest_of_line || src[n] != ' ') && n + 1 < size) n++;
    if (src) memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Read the state file under a shared lock. Returns NULL if there is none (no driver). */
static struct state *load(void) {
    const char *path = getenv("FAKENVML_STATE");
    if (!path) return NULL;
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    while (flock(fileno(f), LOCK_SH) != 0 && errno == EINTR) {}
    struct state *st = calloc(1, sizeof *st);
    if (!st) { fclose(f); return NULL; }
    st->loaded = 1;
    strcpy(st->version, "550.54.15");
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "driver ", 7) == 0) {
            st->loaded = (int)num(line, "loaded", 1);
            st->init_error = (int)num(line, "init_error", 0);
            if (token(line, "version")) copy_word(st->version, sizeof st->version, token(line, "version"), 0);
        } else if (strncmp(line, "gpu ", 4) == 0 && st->ngpus < MAX_GPUS) {
            struct gpu *g = &st->gpus[st->ngpus++];
            copy_word(g->uuid, sizeof g->uuid, token(line, "uuid"), 0);
            copy_word(g->name, sizeof g->name, token(line, "name"), 1);
            g->total = num(line, "total", 0);
            g->other = num(line, "other", 0);
            g->reserved = num(line, "reserved", 0);
            g->util = pct(line, "util", 0);
            g->memutil = pct(line, "memutil", 0);
            g->lost = (int)num(line, "lost", 0);
            g->pcie_switch = token(line, "switch") ? (int)num(line, "switch", 0) : -1;
            g->devutil = pct(line, "devutil", NA);
            g->minor = token(line, "minor") ? (int)num(line, "minor", 0) : -1;
        } else if (strncmp(line, "proc ", 5) == 0 && st->nprocs < MAX_PROCS) {
            struct proc *p = &st->procs[st->nprocs++];
            const char *kind = token(line, "kind");
            p->gpu = (int)num(line, "gpu", 0);
            p->pid = (int)num(line, "pid", 0);
            p->used = num(line, "used", 0);
            p->reported = (int)num(line, "reported", 1);
            p->sm = pct(line, "sm", NA);
            p->start = num(line, "start", 0);
            p->every = (int)num(line, "every", 1);
            p->miss = (int)num(line, "miss", 0);
            if (p->every < 1) p->every = 1;
            p->kind = !kind || strncmp(kind, "compute", 7) == 0 ? 1 : strncmp(kind, "graphics", 8) == 0 ? 2 : 3;
        }
    }
    fclose(f); /* closing drops the lock */
    return st;
}

/* A pid holds GPU memory only while it runs: not gone, not a zombie, not a reused pid. */
static int alive(const struct proc *p) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", p->pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *s = strrchr(buf, ')'); /* comm may contain spaces and parentheses */
    if (!s || s[1] != ' ') return 0;
    char state = s[2];
    if (state == 'Z' || state == 'X' || state == 'x') return 0;
    if (p->start) { /* field 22 (starttime); s+2 is field 3 */
        char *q = s + 2;
        for (int field = 3; field < 22 && q; field++) q = strchr(q + 1, ' ');
        if (!q || strtoull(q + 1, NULL, 10) != p->start) return 0;
    }
    return 1;
}

static unsigned long long used_by(const struct state *st, int gpu) {
    unsigned long long used = st->gpus[gpu].other;
    for (int i = 0; i < st->nprocs; i++)
        if (st->procs[i].gpu == gpu && alive(&st->procs[i])) used += st->procs[i].used;
    return used;
}

/* Common prologue of every per-device query: initialised, state readable, handle valid, not lost. */
static nvmlReturn_t device_state(nvmlDevice_t device, struct state **out) {
    *out = NULL;
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!device || device < devices || device >= devices + MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    struct state *st = load();
    if (!st) return NVML_ERROR_UNKNOWN;
    int index = (int)(device - devices);
    /* A GPU that vanished from the file behaves like one that fell off the bus. */
    if (index >= st->ngpus || st->gpus[index].lost) { free(st); return NVML_ERROR_GPU_IS_LOST; }
    *out = st;
    return NVML_SUCCESS;
}
#define DEVICE_PROLOGUE(device)                           \
    struct state *st;                                     \
    nvmlReturn_t rc = device_state((device), &st);        \
    if (rc != NVML_SUCCESS) return rc;                    \
    const int index = (int)((device) - devices);          \
    struct gpu *g = &st->gpus[index];                     \
    (void)g

static nvmlReturn_t put_string(char *dst, unsigned int length, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

/* ---- init / system ---- */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    struct state *st = load();
    if (!st || !st->loaded) { free(st); return NVML_ERROR_DRIVER_NOT_LOADED; }
    nvmlReturn_t rc = st->init_error;
    free(st);
    if (rc == NVML_SUCCESS) {
        for (int i = 0; i < MAX_GPUS; i++) devices[i].index = i;
        __atomic_add_fetch(&init_count, 1, __ATOMIC_SEQ_CST);
    }
    return rc;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) {
    if (__atomic_load_n(&init_count, __ATOMIC_SEQ_CST) <= 0) return NVML_ERROR_UNINITIALIZED;
    __atomic_sub_fetch(&init_count, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    struct state *st = load();
    if (!st) return NVML_ERROR_UNKNOWN;
    nvmlReturn_t rc = put_string(version, length, st->version);
    free(st);
    return rc;
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    struct state *st = load();
    if (!st) return NVML_ERROR_UNKNOWN;
    char buf[80];
    snprintf(buf, sizeof buf, "12.%s", st->version);
    free(st);
    return put_string(version, length, buf);
}

/* ---- device enumeration ---- */
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    struct state *st = load();
    if (!st) return NVML_ERROR_UNKNOWN;
    *count = (unsigned int)st->ngpus;
    free(st);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    struct state *st = load();
    if (!st) return NVML_ERROR_UNKNOWN;
    nvmlReturn_t rc = index >= (unsigned int)st->ngpus ? NVML_ERROR_INVALID_ARGUMENT
                      : st->gpus[index].lost        ? NVML_ERROR_GPU_IS_LOST
                                                    : NVML_SUCCESS;
    free(st);
    if (rc == NVML_SUCCESS) *device = &devices[index];
    return rc;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    struct state *st = load();
    if (!st) return NVML_ERROR_UNKNOWN;
    nvmlReturn_t rc = NVML_ERROR_NOT_FOUND;
    for (int i = 0; i < st->ngpus; i++)
        if (strcmp(st->gpus[i].uuid, uuid) == 0) {
            rc = st->gpus[i].lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
            if (rc == NVML_SUCCESS) *device = &devices[i];
            break;
        }
    free(st);
    return rc;
}

/* ---- per-device queries ---- */
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *out) {
    DEVICE_PROLOGUE(device);
    free(st);
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    *out = (unsigned int)index;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEVICE_PROLOGUE(device);
    rc = put_string(name, length, g->name);
    free(st);
    return rc;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEVICE_PROLOGUE(device);
    rc = put_string(uuid, length, g->uuid);
    free(st);
    return rc;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    DEVICE_PROLOGUE(device);
    const int number = g->minor < 0 ? index : g->minor;
    free(st);
    if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = (unsigned int)number;
    return NVML_SUCCESS;
}

static void memory(const struct state *st, int index, unsigned long long *used, unsigned long long *free_) {
    const struct gpu *g = &st->gpus[index];
    unsigned long long in_use = used_by(st, index);
    *used = in_use;
    *free_ = g->total > in_use + g->reserved ? g->total - in_use - g->reserved : 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *out) {
    DEVICE_PROLOGUE(device);
    if (!out) { free(st); return NVML_ERROR_INVALID_ARGUMENT; }
    unsigned long long used, free_;
    memory(st, index, &used, &free_);
    out->total = g->total;
    out->free = free_;
    out->used = g->total - free_; /* v1 folds the driver's reserve into `used`, as real v1 does */
    free(st);
    return NVML_SUCCESS;
}
#ifndef FAKENVML_NO_MEMORY_V2
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *out) {
    DEVICE_PROLOGUE(device);
    if (!out) { free(st); return NVML_ERROR_INVALID_ARGUMENT; }
    if (out->version != nvmlMemory_v2) { free(st); return NVML_ERROR_ARGUMENT_VERSION_MISMATCH; }
    unsigned long long used, free_;
    memory(st, index, &used, &free_);
    out->total = g->total;
    out->reserved = g->reserved;
    out->free = free_;
    out->used = used;
    free(st);
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *out) {
    DEVICE_PROLOGUE(device);
    if (!out) { free(st); return NVML_ERROR_INVALID_ARGUMENT; }
    if (g->util == NA) { free(st); return NVML_ERROR_NOT_SUPPORTED; }
    /* The GPU is as busy as the file says plus whatever its live processes add. */
    int util = g->util;
    for (int i = 0; i < st->nprocs && g->devutil == NA; i++) {
        const struct proc *p = &st->procs[i];
        if (p->gpu == index && p->sm != NA && alive(p)) util += p->sm;
    }
    if (g->devutil != NA) util = g->devutil;
    out->gpu = (unsigned int)(util > 100 ? 100 : util);
    out->memory = (unsigned int)(g->memutil == NA ? 0 : g->memutil);
    free(st);
    return NVML_SUCCESS;
}

/* The two-call protocol of the real library: *count too small -> INSUFFICIENT_SIZE + needed count. */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, void *infos, int kind, int v1) {
    DEVICE_PROLOGUE(device);
    if (!count) { free(st); return NVML_ERROR_INVALID_ARGUMENT; }
    unsigned int n = 0;
    for (int i = 0; i < st->nprocs; i++) {
        const struct proc *p = &st->procs[i];
        if (p->gpu != index || !(p->kind & kind) || !alive(p)) continue;
        if (infos && n < *count) {
            unsigned long long used = p->reported ? p->used : VALUE_NOT_AVAILABLE_ULL;
            if (v1) {
                nvmlProcessInfo_v1_t *out = (nvmlProcessInfo_v1_t *)infos + n;
                out->pid = (unsigned int)p->pid;
                out->usedGpuMemory = used;
            } else {
                nvmlProcessInfo_t *out = (nvmlProcessInfo_t *)infos + n;
                out->pid = (unsigned int)p->pid;
                out->usedGpuMemory = used;
                out->gpuInstanceId = out->computeInstanceId = 0xFFFFFFFFu;
            }
        }
        n++;
    }
    free(st);
    rc = n > *count || (n > 0 && !infos) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = n;
    return rc;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *i) {
    return processes(d, c, i, 1, 1);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i) {
    return processes(d, c, i, 1, 0);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *i) {
    return processes(d, c, i, 2, 1);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i) {
    return processes(d, c, i, 2, 0);
}
#ifndef FAKENVML_NO_PROCESS_V3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i) {
    return processes(d, c, i, 1, 0);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i) {
    return processes(d, c, i, 2, 0);
}
#endif

/* Polls of nvmlDeviceGetProcessUtilization per GPU in this process (a poll: the call that
 * returns samples, or finds none), for every=N miss=M. */
static unsigned long process_util_calls[MAX_GPUS];

/* One sample per live process that has an `sm` value (and, with every=N, whose turn it is),
 * stamped now. As the real library does, answer NOT_FOUND when there is no sample newer
 * than lastSeenTimeStamp. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *samples,
                                             unsigned int *count, unsigned long long lastSeenTimeStamp) {
    DEVICE_PROLOGUE(device);
    if (!count) { free(st); return NVML_ERROR_INVALID_ARGUMENT; }
    struct timeval tv;
    gettimeofday(&tv, NULL);
    unsigned long long now_us = (unsigned long long)tv.tv_sec * 1000000ULL + (unsigned long long)tv.tv_usec;
    unsigned int n = 0;
    unsigned long call = process_util_calls[index];
    for (int i = 0; i < st->nprocs && now_us > lastSeenTimeStamp; i++) {
        const struct proc *p = &st->procs[i];
        if (p->gpu != index || p->sm == NA || !alive(p) || call % (unsigned long)p->every < (unsigned long)p->miss) continue;
        if (samples && n < *count) {
            samples[n].pid = (unsigned int)p->pid;
            samples[n].timeStamp = now_us;
            samples[n].smUtil = (unsigned int)p->sm;
            samples[n].memUtil = samples[n].encUtil = samples[n].decUtil = 0;
        }
        n++;
    }
    free(st);
    /* A poll is over when it got its samples or there were none (the sizing call then ends it). */
    if (samples || n == 0) process_util_calls[index]++;
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    if (!samples) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    /* A process that appeared between the sizing call and this one is simply not sampled. */
    if (n < *count) *count = n;
    return NVML_SUCCESS;
}

/* nvmlGpuTopologyLevel_t: INTERNAL 0, SINGLE 10, MULTIPLE 20, HOSTBRIDGE 30, NODE 40, SYSTEM 50. */
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                 unsigned int *pathInfo) {
    DEVICE_PROLOGUE(device1);
    if (!pathInfo || !device2 || device2 < devices || device2 >= devices + st->ngpus) {
        free(st);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    const struct gpu *other = &st->gpus[device2 - devices];
    nvmlReturn_t answer = NVML_SUCCESS;
    if (device1 == device2) *pathInfo = 0;
    else if (g->pcie_switch < 0 && other->pcie_switch < 0) answer = NVML_ERROR_NOT_SUPPORTED;
    else *pathInfo = g->pcie_switch == other->pcie_switch ? 10 : 30;
    free(st);
    return answer;
}
