/* The definition an interposer (rtld_next_wrap.c) reaches with dlsym(RTLD_NEXT). */
int gs_probe(void) { return 1; }
