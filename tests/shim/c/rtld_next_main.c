#include <stdio.h>
int gs_probe(void);
int main(void) {
    printf("probe %d\n", gs_probe());
    return 0;
}
