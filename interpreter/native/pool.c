/* mlxgraph's work-sharing thread pool (pool.h): persistent helpers sleep on a condition
 * variable (no spinning between products, unlike OpenBLAS's own workers, which on a shared
 * machine compete with every other process) and claim chunks with an atomic counter. */
#include "pool.h"

#include <pthread.h>

#define MAX_HELPERS 7

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
static long generation;
static int helpers, active, wanted;   /* started helpers; helpers inside a job; may join */

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
        pthread_mutex_lock(&lock);
        while (generation == seen) pthread_cond_wait(&wake, &lock);
        seen = generation;
        struct job *j = current;
        if (j && wanted > 0) {
            wanted--;
            active++;
        } else {
            j = NULL;
        }
        pthread_mutex_unlock(&lock);
        if (!j) continue;
        work(j);
        pthread_mutex_lock(&lock);
        if (--active == 0) pthread_cond_signal(&idle);
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
    generation++;
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);
    work(&j);
    pthread_mutex_lock(&lock);
    current = NULL;   /* late helpers skip this job; those inside finish their chunk */
    wanted = 0;
    while (active > 0) pthread_cond_wait(&idle, &lock);
    pthread_mutex_unlock(&lock);
    pthread_mutex_unlock(&call_lock);
}
