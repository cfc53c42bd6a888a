/* Placeholder entry point of the `kdloss` command; the real one lands with the bench tool. */
#include <stdio.h>

#include "kdloss.h"

int main(int argc, char **argv) {
    (void)argv;
    printf("kdloss %s\n", kdloss_version());
    return argc > 1 ? 2 : 0;
}
