/* watchdog.c — the stall watchdog thread (see watchdog.h).
 *
 * The shared state is a handful of words written by the main thread and read by the
 * watchdog and heartbeat threads; they are C11 atomics so a torn read cannot happen.
 * This is, with the signal flag and the log sink, the process-wide state the conventions
 * allow (docs/conventions.md "Errors"): a watchdog is by nature one per process. */
#include "watchdog.h"

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "util.h"

static struct {
  double timeout_s;
  int mpi_threads;
  pthread_t thread;
  int running;
  atomic_int stop;
  _Atomic double since;               /* when the current activity started */
  _Atomic int64_t step;
  _Atomic(const char *) what, group, op;
  atomic_int blocked;
  _Atomic(tsr_watchdog_peers_fn) peers;
} g_dog;

void tsr_watchdog_state_now(tsr_watchdog_state *st) {
  const char *what = atomic_load(&g_dog.what), *group = atomic_load(&g_dog.group),
             *op = atomic_load(&g_dog.op);
  st->step = atomic_load(&g_dog.step);
  st->in_s = tsr_now() - atomic_load(&g_dog.since);
  st->active = what != NULL;
  st->blocked = atomic_load(&g_dog.blocked);
  snprintf(st->what, sizeof st->what, "%s", what ? what : "");
  snprintf(st->group, sizeof st->group, "%.*s", (int)sizeof st->group - 1, group ? group : "");
  snprintf(st->op, sizeof st->op, "%s", op ? op : "");
}

void tsr_watchdog_state_text(const tsr_watchdog_state *st, char *buf, size_t len) {
  int n;
  if (st->active)
    n = snprintf(buf, len, "at step %lld, %.1f s into %s", (long long)st->step, st->in_s,
                 st->what);
  else
    n = snprintf(buf, len, "at step %lld, outside any step (starting, between steps or "
                 "finishing)", (long long)st->step);
  if (n < 0 || (size_t)n >= len) return;
  if (st->blocked && st->op[0])
    snprintf(buf + n, len - (size_t)n, ", inside %s on group '%s'", st->op, st->group);
  else if (st->blocked)
    snprintf(buf + n, len - (size_t)n, ", inside an MPI call");
  else if (st->active && st->op[0])
    snprintf(buf + n, len - (size_t)n, ", outside MPI (last operation started: %s on group "
             "'%s')", st->op, st->group);
  else if (st->active)
    snprintf(buf + n, len - (size_t)n, ", outside MPI");
}

static void *watch(void *arg) {
  (void)arg;
  while (!atomic_load(&g_dog.stop)) {
    usleep(200 * 1000);
    const char *what = atomic_load(&g_dog.what);
    const double stalled = tsr_now() - atomic_load(&g_dog.since);
    const int blocked = atomic_load(&g_dog.blocked);
    if (!what || stalled <= g_dog.timeout_s * (blocked ? 1.5 : 1.0)) continue;
    const char *group = atomic_load(&g_dog.group), *op = atomic_load(&g_dog.op);
    const char *how = g_dog.mpi_threads ? "aborting the job with MPI_Abort (exit code 4)"
                                        : "exiting with code 4 (the launcher ends the job)";
    char peer[512] = "";
    const tsr_watchdog_peers_fn peers = atomic_load(&g_dog.peers);
    if (blocked && peers && peers(peer + 2, sizeof peer - 2)) peer[0] = ':', peer[1] = ' ';
    if (blocked)
      fprintf(stderr,
              "[rank %d] watchdog: step %lld has been in %s for %.0f s (run.step_timeout_s = "
              "%.0f), blocked in %s on group '%s' waiting for a peer%s; %s\n",
              tsr_rank(), (long long)atomic_load(&g_dog.step), what, stalled, g_dog.timeout_s,
              op ? op : "?", op ? group : "?", peer, how);
    else
      fprintf(stderr,
              "[rank %d] watchdog: step %lld has been in %s for %.0f s (run.step_timeout_s = "
              "%.0f) and this rank is not inside any collective (last one started: %s on "
              "group '%s'): this rank is stuck; %s\n",
              tsr_rank(), (long long)atomic_load(&g_dog.step), what, stalled, g_dog.timeout_s,
              op ? op : "none", op ? group : "-", how);
    fflush(stderr);
    if (g_dog.mpi_threads) MPI_Abort(MPI_COMM_WORLD, TSR_ERR_WATCHDOG);
    _exit(TSR_ERR_WATCHDOG);
  }
  return NULL;
}

int tsr_watchdog_start(double timeout_s, int mpi_threads) {
  if (timeout_s <= 0 || g_dog.running) return 0;
  g_dog.timeout_s = timeout_s;
  g_dog.mpi_threads = mpi_threads;
  atomic_store(&g_dog.stop, 0);
  atomic_store(&g_dog.what, NULL);
  atomic_store(&g_dog.since, tsr_now());
  TSR_CHECK(pthread_create(&g_dog.thread, NULL, watch, NULL) == 0, TSR_ERR,
            "cannot start the watchdog thread");
  g_dog.running = 1;
  return 0;
}

void tsr_watchdog_stop(void) {
  if (!g_dog.running) return;
  atomic_store(&g_dog.stop, 1);
  pthread_join(g_dog.thread, NULL);
  g_dog.running = 0;
}

void tsr_watchdog_activity(int64_t step, const char *what) {
  atomic_store(&g_dog.step, step);
  atomic_store(&g_dog.op, NULL);
  atomic_store(&g_dog.since, tsr_now());
  atomic_store(&g_dog.what, what);
}

void tsr_watchdog_blocked(int blocked) { atomic_store(&g_dog.blocked, blocked); }

void tsr_watchdog_operation(const char *group, const char *op) {
  atomic_store(&g_dog.group, group);
  atomic_store(&g_dog.op, op);
}

void tsr_watchdog_forget_group(const char *group) {
  const char *expected = group;
  if (atomic_compare_exchange_strong(&g_dog.group, &expected, NULL)) atomic_store(&g_dog.op, NULL);
}

void tsr_watchdog_set_peers(tsr_watchdog_peers_fn fn) { atomic_store(&g_dog.peers, fn); }
