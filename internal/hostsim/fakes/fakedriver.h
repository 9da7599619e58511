// fakedriver.h: how the other fake libraries reach the fake libcuda
// (fakecuda.c) loaded from $MOEBENCH_LIBCUDA (tests load several, one per
// test): fakecuda_sym looks a symbol up in it, or returns NULL.
#include <dlfcn.h>
#include <stdlib.h>
static void *fakecuda_sym(const char *name) {
    const char *path = getenv("MOEBENCH_LIBCUDA");
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : 0;
    void *f = h ? dlsym(h, name) : 0;
    if (h) dlclose(h);
    return f;
}
// fakecuda_enqueue queues fn(arg) on a stream of the fake driver;
// fakecuda_enqueue2 queues work a graph may capture and replay: fn leaves
// arg as it was, release(arg) frees it
typedef int (*enqueue_fn)(void *stream, void (*fn)(void *), void *arg);
typedef int (*enqueue2_fn)(void *stream, void (*fn)(void *), void *arg, void (*release)(void *));
