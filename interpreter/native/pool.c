/* mlxgraph's work-sharing thread pool (pool.h): persistent helpers claim chunks with an
 * atomic counter. Between jobs a helper spins, yielding, for SPIN_NS and then sleeps on a
 * condition variable: a prefill's products come back to back, and waking a sleeping thread
 * on a VM goes through the hypervisor (a 128-row 1024 x 2816 product on two threads took
 * 4.2 ms with sleeping helpers, 2.9 ms with spinning ones; one thread 5.1 ms). Unlike
 * OpenBLAS's own workers, which spin for much longer, an idle process soon costs nothing. */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#define MAX_HELPERS 7
#define SPIN_NS 200000L

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

/* Spin until *value differs from `from` or SPIN_NS pass, yielding to runnable threads (the
 * Python thread building the next step runs first; an idle core comes straight back). */
static void spin_while_equal(const long *value, long from) {
    long until = now_ns() + SPIN_NS;
    while (__atomic_load_n(value, __ATOMIC_ACQUIRE) == from && now_ns() < until) {
        for (int i = 0; i < 16; i++) relax();
        sched_yield();
    }
}

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
static long generation;   /* written under lock, read outside it by spinning helpers */
static long active;       /* helpers inside a job (written under lock, read by the caller) */
static int helpers, wanted;   /* started helpers; helpers that may still join the job */

static void work(struct job *j) {
    for (;;) {
        int c = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (c >= j->chunks) return;
        j->fn(j->ctx, c);
    }
}

static void *helper(void *arg) {
    (void)arg;
    long seen = 0;
    for (;;) {
        spin_while_equal(&generation, seen);
        pthread_mutex_lock(&lock);
        while (generation == seen) pthread_cond_wait(&wake, &lock);
        seen = generation;
        struct job *j = current;
        if (j && wanted > 0) {
            wanted--;
            __atomic_store_n(&active, active + 1, __ATOMIC_RELEASE);
        } else {
            j = NULL;
        }
        pthread_mutex_unlock(&lock);
        if (!j) continue;
        work(j);
        pthread_mutex_lock(&lock);
        __atomic_store_n(&active, active - 1, __ATOMIC_RELEASE);
        if (active == 0) pthread_cond_signal(&idle);
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

void pool_run(void (*fn)(void *, int), void *ctx, int chunks, int threads) {
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
    __atomic_store_n(&generation, generation + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);
    work(&j);
    pthread_mutex_lock(&lock);
    current = NULL;   /* late helpers skip this job; those inside finish their chunk */
    wanted = 0;
    long inside = active;
    pthread_mutex_unlock(&lock);
    /* Helpers still inside hold a chunk each: wait for them spinning before sleeping. */
    for (long until = now_ns() + SPIN_NS; inside > 0 && now_ns() < until;) {
        relax();
        inside = __atomic_load_n(&active, __ATOMIC_ACQUIRE);
    }
    pthread_mutex_lock(&lock);
    while (active > 0) pthread_cond_wait(&idle, &lock);
    pthread_mutex_unlock(&lock);
    pthread_mutex_unlock(&call_lock);
}
