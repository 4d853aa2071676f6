/* The machine's read bandwidth as a streaming kernel sees it (benchmarks/machine.py builds
 * and runs this when a C compiler is present): THREADS threads each sum their slice of a
 * MIB MiB float array with 64-byte vector loads and four independent sums, best of REPEATS;
 * prints the bytes per second. numpy's pairwise float32 sum is too slow per core to show
 * the bound on a busy machine, and a decode kernel streams exactly like this.
 *
 *     read_probe MIB THREADS REPEATS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef float vf __attribute__((vector_size(64)));

struct slice {
    const vf *a;
    long n;
    float sum;
};

static void *sum_slice(void *arg) {
    struct slice *s = arg;
    vf t0 = {0}, t1 = {0}, t2 = {0}, t3 = {0};
    for (long i = 0; i + 4 <= s->n; i += 4) {
        t0 += s->a[i];
        t1 += s->a[i + 1];
        t2 += s->a[i + 2];
        t3 += s->a[i + 3];
    }
    vf t = t0 + t1 + t2 + t3;
    for (int l = 0; l < 16; l++) s->sum += t[l];
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    long bytes = atol(argv[1]) << 20;
    int threads = atoi(argv[2]), repeats = atoi(argv[3]);
    if (threads < 1 || threads > 64 || bytes < (1 << 20)) return 2;
    long n = bytes / sizeof(vf);
    vf *a = aligned_alloc(64, n * sizeof(vf));
    if (!a) return 1;
    memset(a, 0, n * sizeof(vf));   /* touch every page first */
    pthread_t tid[64];
    struct slice s[64];
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        double t = now();
        for (int i = 0; i < threads; i++) {
            s[i] = (struct slice){a + n / threads * i, n / threads, 0.0f};
            pthread_create(&tid[i], NULL, sum_slice, &s[i]);
        }
        for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
        t = now() - t;
        if (t < best) best = t;
    }
    printf("%.0f\n", (double)(n / threads * threads) * sizeof(vf) / best);
    free(a);
    return 0;
}
