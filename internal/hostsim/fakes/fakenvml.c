/* A fake libnvidia-ml.so.1 for the tests: the calls moebench makes through
 * go-nvml, its one NVML binding (internal/cuda/nvml.go: driver version,
 * power limit, NVLinks; harness/telemetry.go: telemetry). It has two GPUs
 * whose NVML order is not the fake CUDA driver's: NVML index 0 is the GPU at 0000:2C:00.0 (CUDA device 1),
 * index 1 the GPU at 0000:1B:00.0 (CUDA device 0). Each answers with its own
 * values (power limit, clocks, power, memory, GPM) so that a test sees which
 * GPU was read. GPM needs the struct versions go-nvml should set. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

typedef struct { int bus; unsigned limit_mw, sm_mhz, mem_mhz, power_mw; unsigned long long used; double util; } gpu_t;
static gpu_t gpus[2] = {
    {0x2c, 350000, 1100, 1200, 150000, 1ull << 30, 11.0},
    {0x1b, 700000, 1980, 2619, 500000, 5ull << 30, 77.0},
};
static int inited;

static gpu_t *gpu(void *d) {
    for (int i = 0; i < 2; i++)
        if (d == (void *)&gpus[i]) return &gpus[i];
    return NULL;
}

int nvmlInit_v2(void) { inited = 1; return 0; }
int nvmlShutdown(void) { inited = 0; return 0; }
const char *nvmlErrorString(int r) { return r == 0 ? "Success" : "Fake NVML error"; }
int nvmlSystemGetDriverVersion(char *s, unsigned int n) { if (!inited) return 1; strncpy(s, "580.00.fake", n); return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { if (!inited) return 1; *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **d) {
    if (!inited) return 1;
    if (i >= 2) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *d = &gpus[i]; return 0;
}
int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **d) {
    if (!inited) return 1;
    for (int i = 0; i < 2; i++) {
        char want[16];
        sprintf(want, "0000:%02x:00.0", gpus[i].bus);
        if (strcasecmp(bus, want) == 0) { *d = &gpus[i]; return 0; }
    }
    return 6; /* NVML_ERROR_NOT_FOUND */
}
int nvmlDeviceGetPowerManagementLimit(void *d, unsigned int *mw) { gpu_t *g = gpu(d); if (!g) return 2; *mw = g->limit_mw; return 0; }
int nvmlDeviceGetPowerUsage(void *d, unsigned int *mw) { gpu_t *g = gpu(d); if (!g) return 2; *mw = g->power_mw; return 0; }
int nvmlDeviceGetClockInfo(void *d, int type, unsigned int *mhz) {
    gpu_t *g = gpu(d);
    if (!g || (type != 1 && type != 2)) return 2;
    *mhz = type == 1 ? g->sm_mhz : g->mem_mhz; return 0;
}
/* NVLinks: the GPU at 0000:1B:00.0 has 18, of which links 3 and 7 are
 * down; the other has none (NVML_ERROR_NOT_SUPPORTED) */
int nvmlDeviceGetNvLinkState(void *d, unsigned int link, unsigned int *on) {
    gpu_t *g = gpu(d);
    if (!g) return 2;
    if (g->bus != 0x1b) return 3;
    if (link >= 18) return 2;
    *on = link != 3 && link != 7; return 0;
}
typedef struct { unsigned long long total, free, used; } mem_t;
int nvmlDeviceGetMemoryInfo(void *d, mem_t *m) {
    gpu_t *g = gpu(d);
    if (!g) return 2;
    m->total = 80ull << 30; m->used = g->used; m->free = m->total - m->used; return 0;
}

/* GPM: a sample remembers the GPU it was taken on and when. NVML's header
 * says the two samples should be more than 100 ms apart (its counters'
 * refresh rate); the fake, stricter, refuses metrics from closer samples. */
typedef struct { unsigned int version, supported; } gpm_support_t;
int nvmlGpmQueryDeviceSupport(void *d, gpm_support_t *s) {
    if (!gpu(d) || s->version != 1) return 2;
    s->supported = 1; return 0;
}
typedef struct { void *dev; double t; } sample_t;
static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec * 1e-9; }
int nvmlGpmSampleAlloc(void **s) { *s = calloc(1, sizeof(sample_t)); return *s ? 0 : 2; }
int nvmlGpmSampleFree(void *s) { free(s); return 0; }
int nvmlGpmSampleGet(void *d, void *s) {
    if (!gpu(d) || !s) return 2;
    ((sample_t *)s)->dev = d, ((sample_t *)s)->t = now(); return 0;
}
typedef struct { char *shortName, *longName, *unit; } metric_info_t;
typedef struct { unsigned int id; int ret; double value; metric_info_t info; } metric_t;
typedef struct { unsigned int version, n; void *s1, *s2; metric_t m[210]; } metrics_get_t;
int nvmlGpmMetricsGet(metrics_get_t *g) {
    if (g->version != 1 || !g->s1 || !g->s2) return 2;
    sample_t *s1 = g->s1, *s2 = g->s2;
    gpu_t *a = gpu(s1->dev), *b = gpu(s2->dev);
    if (!a || a != b || s2->t - s1->t <= 0.1) return 2;
    for (unsigned i = 0; i < g->n; i++) {
        g->m[i].ret = 0;
        switch (g->m[i].id) {
        case 2: g->m[i].value = a->util; break;       /* SM utilisation */
        case 3: g->m[i].value = a->util / 2; break;   /* SM occupancy */
        default: g->m[i].ret = 2;
        }
    }
    return 0;
}
