/* Preloaded (LD_PRELOAD) into an untraced program by benches/processes.rs: starts one thread
 * that sleeps for the life of the process. It measures what a second thread costs a
 * single-threaded program before the thread does anything (glibc's malloc leaves its
 * single-threaded mode: arena locks and atomic operations), the floor under any tracer with a
 * background thread. */
#include <pthread.h>
#include <unistd.h>

static void *sleep_forever(void *unused) {
    for (;;)
        pause();
    return unused;
}

__attribute__((constructor)) static void start_idle_thread(void) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, sleep_forever, NULL) == 0)
        pthread_detach(thread);
}
