/* mlxgraph's work-sharing thread pool (pool.h): persistent helpers claim chunks with an
 * atomic counter; between jobs they spin for the job's linger time (none for the router's
 * products, unlike OpenBLAS's own workers, which on a shared machine compete with every
 * other process) and then sleep on a condition variable. Valid C and C++: the C++
 * matrix-vector extension compiles it into its one translation unit (matvec_common.h). */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#define MAX_HELPERS (POOL_MAX_THREADS - 1)

struct job {
    void (*fn)(void *, int);
    void *ctx;
    int chunks;
    int next;   /* the next unclaimed chunk (atomic) */
};

static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;   /* one job at a time */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t idle = PTHREAD_COND_INITIALIZER;
static struct job *current;   /* NULL when no job may be joined */
static long generation;       /* written under lock, read atomically by spinning helpers */
static long linger;           /* the latest job's linger_ns */
static int helpers, active, wanted;   /* started helpers; helpers inside a job; may join */

static void work(struct job *j) {
    for (;;) {
        int c = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (c >= j->chunks) return;
        j->fn(j->ctx, c);
    }
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void relax(void) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* Spin while the generation is `seen`, for up to linger_ns, yielding: a runnable thread of
 * this core (the Python thread building the next step) runs first, and an idle core comes
 * straight back here. */
static void spin_for_a_job(long seen, long linger_ns) {
    if (linger_ns <= 0) return;
    long until = now_ns() + linger_ns;
    while (__atomic_load_n(&generation, __ATOMIC_ACQUIRE) == seen && now_ns() < until) {
        for (int i = 0; i < 16; i++) relax();
        sched_yield();
    }
}

static void *helper(void *arg) {
    (void)arg;
    long seen = 0, after = 0;
    for (;;) {
        spin_for_a_job(seen, after);
        pthread_mutex_lock(&lock);
        while (generation == seen) pthread_cond_wait(&wake, &lock);
        seen = generation;
        after = linger;
        struct job *j = current;
        if (j && wanted > 0) {
            wanted--;
            __atomic_add_fetch(&active, 1, __ATOMIC_RELAXED);
        } else {
            j = NULL;
        }
        pthread_mutex_unlock(&lock);
        if (!j) continue;
        work(j);
        pthread_mutex_lock(&lock);
        if (__atomic_sub_fetch(&active, 1, __ATOMIC_RELEASE) == 0) pthread_cond_signal(&idle);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

/* A forked child has none of the parent's helpers, and a lock may have been held. */
static void after_fork_in_child(void) {
    pthread_mutex_init(&call_lock, NULL);
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&wake, NULL);
    pthread_cond_init(&idle, NULL);
    current = NULL;
    helpers = active = wanted = 0;
}

void pool_run(void (*fn)(void *, int), void *ctx, int chunks, int threads, long linger_ns) {
    struct job j = {fn, ctx, chunks, 0};
    if (threads > MAX_HELPERS + 1) threads = MAX_HELPERS + 1;
    if (threads <= 1 || chunks <= 1) {
        work(&j);
        return;
    }
    pthread_mutex_lock(&call_lock);
    static int fork_handler;
    if (!fork_handler) fork_handler = pthread_atfork(NULL, NULL, after_fork_in_child) == 0;
    while (helpers < threads - 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, helper, NULL) != 0) break;
        pthread_detach(t);
        helpers++;
    }
    pthread_mutex_lock(&lock);
    current = &j;
    wanted = threads - 1;
    linger = linger_ns;
    __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);
    work(&j);
    pthread_mutex_lock(&lock);
    current = NULL;   /* late helpers skip this job; those inside finish their chunk */
    wanted = 0;
    if (linger_ns > 0) {   /* no sleep for the helpers' last chunks either */
        pthread_mutex_unlock(&lock);
        while (__atomic_load_n(&active, __ATOMIC_ACQUIRE) > 0) relax();
        pthread_mutex_lock(&lock);
    }
    while (active > 0) pthread_cond_wait(&idle, &lock);
    pthread_mutex_unlock(&lock);
    pthread_mutex_unlock(&call_lock);
}
