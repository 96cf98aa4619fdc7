/* An interposer as profilers write them: its gs_probe wraps the next definition, found with
 * dlsym(RTLD_NEXT). If dlsym answered as if asked from elsewhere, it would find itself and recurse. */
#define _GNU_SOURCE
#include <dlfcn.h>

int gs_probe(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "gs_probe");
    if (!next || next == gs_probe) return -1;
    return 10 + next();
}
