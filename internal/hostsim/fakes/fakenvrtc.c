// A fake libnvrtc for the binding tests: the architectures it supports are
// $FAKENVRTC_ARCHS (comma-separated compute capabilities × 10; default
// NVRTC 12.6's list, which has no Blackwell), and like NVRTC it refuses
// --gpu-architecture for any other, gives a cubin for sm_XY and only PTX
// for compute_XY (nvrtcGetCUBINSize 0). The images are text naming the
// target; nothing is compiled.
#define MB_ABI_DECLARE // moebench's prototypes: a definition here that differs does not compile
#include "abi.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int archs[64], narchs;
static void load(void) {
    const char *e = getenv("FAKENVRTC_ARCHS");
    char buf[512];
    snprintf(buf, sizeof buf, "%s", e ? e : "50,52,53,60,61,62,70,72,75,80,86,87,89,90");
    narchs = 0;
    for (char *t = strtok(buf, ","); t && narchs < 64; t = strtok(0, ",")) archs[narchs++] = atoi(t);
}
int nvrtcVersion(int *major, int *minor) { *major = 12; *minor = 6; return 0; }
int nvrtcGetNumSupportedArchs(int *n) { load(); *n = narchs; return 0; }
int nvrtcGetSupportedArchs(int *a) { load(); memcpy(a, archs, sizeof(int) * narchs); return 0; }
typedef struct { char image[128]; int ptx, compiled; char log[128]; } prog;
int nvrtcCreateProgram(void **p, const char *src, const char *name, int n, const char *const *h, const char *const *hn) {
    if (!src || n < 0) return 3; // NVRTC_ERROR_INVALID_INPUT
    *p = calloc(1, sizeof(prog)); return 0;
}
int nvrtcCompileProgram(void *p, int n, const char *const *opts) {
    prog *g = p;
    load();
    for (int i = 0; i < n; i++) {
        int cc = 0, ptx = 0;
        if (sscanf(opts[i], "--gpu-architecture=sm_%d", &cc) != 1 && (ptx = sscanf(opts[i], "--gpu-architecture=compute_%d", &cc)) != 1) continue;
        int ok = 0;
        for (int j = 0; j < narchs; j++) ok |= archs[j] == cc;
        if (!ok) {
            snprintf(g->log, sizeof g->log, "nvrtc: error: invalid value for --gpu-architecture (-arch)\n");
            return 5; // NVRTC_ERROR_INVALID_OPTION
        }
        g->ptx = ptx;
        snprintf(g->image, sizeof g->image, ptx ? "// fake PTX\n.target sm_%d\n" : "\x7f" "ELF fake cubin sm_%d", cc);
    }
    g->compiled = 1; return 0;
}
int nvrtcGetProgramLogSize(void *p, size_t *n) { *n = strlen(((prog *)p)->log) + 1; return 0; }
int nvrtcGetProgramLog(void *p, char *log) { strcpy(log, ((prog *)p)->log); return 0; }
int nvrtcGetCUBINSize(void *p, size_t *n) { prog *g = p; *n = g->compiled && !g->ptx ? strlen(g->image) + 1 : 0; return 0; }
int nvrtcGetCUBIN(void *p, char *b) { memcpy(b, ((prog *)p)->image, strlen(((prog *)p)->image) + 1); return 0; }
int nvrtcGetPTXSize(void *p, size_t *n) { prog *g = p; *n = g->compiled && g->ptx ? strlen(g->image) + 1 : 0; return 0; }
int nvrtcGetPTX(void *p, char *b) { memcpy(b, ((prog *)p)->image, strlen(((prog *)p)->image) + 1); return 0; }
int nvrtcDestroyProgram(void **p) { free(*p); *p = 0; return 0; }
const char *nvrtcGetErrorString(int r) { return r == 5 ? "NVRTC_ERROR_INVALID_OPTION" : r ? "NVRTC_ERROR" : "NVRTC_SUCCESS"; }
