/* The driver side of the fault tests (test_fault_inject.c, test_fault_gemm.c): attaching the
 * allocation-failure shim (malloc_shim.c) and running one injection in a forked child with a
 * timeout. Header-only: each test is its own program. Include after _GNU_SOURCE and the system
 * headers the tests use (dlfcn, errno, signal, string, sys/mman, sys/wait, time, unistd). */
#ifndef KDLOSS_FAULT_DRIVER_H
#define KDLOSS_FAULT_DRIVER_H

#include "malloc_shim.h"

#ifndef KDFI_SHIM
#error "KDFI_SHIM (path of libkdfault_shim.so) must be defined"
#endif

/* Makes sure the shim is loaded, re-executing this program with it in LD_PRELOAD when not (so
 * it sees every allocation from the start); maps one page shared with forked children: the
 * shim's state in *sh, an int at offset 2048 in *child_result; points the shim at *sh with
 * nothing armed. Returns 0, or 1 after printing why not (`name`: the test's). */
static int kdfi_attach(const char *name, char **argv, kdfi_state **sh,
                       volatile int **child_result) {
    kdfi_use_fn use = (kdfi_use_fn)dlsym(RTLD_DEFAULT, "kdfi_use");
    if (!use) {
        if (getenv("KDFI_REEXEC")) {
            printf("%s: the shim %s did not load via LD_PRELOAD\n", name, KDFI_SHIM);
            return 1;
        }
        const char *old = getenv("LD_PRELOAD");
        char pre[4096];
        snprintf(pre, sizeof pre, "%s%s%s", KDFI_SHIM, old && *old ? ":" : "", old ? old : "");
        setenv("LD_PRELOAD", pre, 1);
        setenv("KDFI_REEXEC", "1", 1);
        execv("/proc/self/exe", argv);
        printf("%s: re-exec failed: %s\n", name, strerror(errno));
        return 1;
    }
    void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return 1;
    *sh = (kdfi_state *)page;
    *child_result = (volatile int *)((char *)page + 2048);
    (*sh)->fail_at = -1;
    use(*sh);
    return 0;
}

/* Forks; the child runs child(arg), which must _exit(0) after storing its verdict in the shared
 * page (a backstop alarm ends it if the parent dies). Returns 1 when it exited with 0 within
 * timeout_s seconds, else 0 with how it ended in buf (fork failure, hang: killed, signal, a
 * non-zero exit from inside the call). */
static int kdfi_fork(int timeout_s, void (*child)(void *), void *arg, char *buf, size_t n) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(buf, n, "fork failed: %s", strerror(errno));
        return 0;
    }
    if (pid == 0) {
        alarm((unsigned)timeout_s + 5);
        child(arg);
        _exit(0);
    }
    int status = 0;
    struct timespec t0, now, nap = {0, 2000000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (waitpid(pid, &status, WNOHANG) == pid) break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            snprintf(buf, n, "HANG (killed after %d s)", timeout_s);
            return 0;
        }
        nanosleep(&nap, NULL);
    }
    if (WIFSIGNALED(status)) {
        snprintf(buf, n, "SIGNAL %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
        return 0;
    }
    if (WEXITSTATUS(status) != 0) {
        snprintf(buf, n, "EXIT(%d) inside the call", WEXITSTATUS(status));
        return 0;
    }
    return 1;
}

#endif
