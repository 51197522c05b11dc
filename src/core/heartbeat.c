/* heartbeat.c — the liveness thread of every rank (heartbeat.h).
 *
 * Rank 0 is the hub: it keeps one receive posted from every other rank and sends each a
 * beat every interval; every other rank keeps one receive posted from rank 0 and sends it
 * a beat every interval.  All messages of a pair travel on one tag, so MPI delivers them
 * in order and a goodbye is the last thing a peer receives.  A send still pending when the
 * next beat is due (the receiver is not taking messages) is left alone and the beat
 * skipped, so nothing piles up behind a frozen rank.  Errors of the heartbeat's own
 * communicator are returned, not fatal: a peer whose messages fail simply goes silent and
 * is reported when the timeout runs out.
 *
 * The thread's tables (when each peer was last heard, what it said) are read by the
 * watchdog thread through describe_peers, under a mutex.  One heartbeat per process: the
 * state is process-wide, like the watchdog's (docs/conventions.md "Failing together"). */
#define _GNU_SOURCE /* pthread_setname_np */
#include "heartbeat.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util.h"
#include "watchdog.h"

enum { TAG = 4862, HOST_LEN = 64, BEAT = 1, BYE = 2 };

typedef struct {
  int32_t kind;              /* BEAT or BYE */
  int32_t suspect;           /* rank 0's beats: the rank the job seems to wait for, or -1 */
  double suspect_silent_s;   /* ... how long rank 0 had not heard from it */
  tsr_watchdog_state self;   /* what the sender is doing */
  tsr_watchdog_state suspect_state;
  char suspect_host[HOST_LEN];
} hb_msg;

typedef struct {
  int rank;
  char host[HOST_LEN];
  hb_msg rbuf, sbuf;
  double heard;              /* tsr_now() when its last message arrived (or the start) */
  int got;                   /* a beat has arrived: `last` holds its state */
  int bye;                   /* it said goodbye: no longer watched */
  int broken;                /* an MPI call on its messages failed: it can only go silent */
  tsr_watchdog_state last;
} hb_peer;

static struct {
  double timeout_s, interval_s;
  useconds_t poll_us;
  MPI_Comm comm;
  int rank, hub;             /* hub: this is rank 0 */
  int n_peers;               /* rank 0: every other rank; the others: rank 0 alone */
  hb_peer *peer;
  MPI_Request *rreq, *sreq;  /* per peer: the receive posted, the last send */
  int *done;                 /* MPI_Testsome's indices */
  MPI_Status *status;
  /* from rank 0's last beat (other ranks) */
  int suspect;
  double suspect_silent_s, suspect_at;
  tsr_watchdog_state suspect_state;
  char suspect_host[HOST_LEN];
  pthread_t thread;
  int running;
  atomic_int stop;
  pthread_mutex_t lock;      /* peer[].heard, .got, .last, .bye and the suspect fields */
} g_hb = {.comm = MPI_COMM_NULL, .lock = PTHREAD_MUTEX_INITIALIZER};

static void post_recv(int i) {
  hb_peer *p = &g_hb.peer[i];
  if (MPI_Irecv(&p->rbuf, (int)sizeof p->rbuf, MPI_BYTE, p->rank, TAG, g_hb.comm,
                &g_hb.rreq[i]) != MPI_SUCCESS) {
    g_hb.rreq[i] = MPI_REQUEST_NULL;
    p->broken = 1;
  }
}

/* MPI_Testsome over reqs (one progress call for all peers, which matters on rank 0): the
 * number of requests that completed, their indices in g_hb.done; a request that failed
 * marks its peer broken and is not counted. */
static int completed(MPI_Request *reqs) {
  int n = 0;
  const int rc = MPI_Testsome(g_hb.n_peers, reqs, &n, g_hb.done, g_hb.status);
  if (n == MPI_UNDEFINED || (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS)) return 0;
  int ok = 0;
  for (int k = 0; k < n; k++) {
    const int i = g_hb.done[k];
    if (rc == MPI_ERR_IN_STATUS && g_hb.status[k].MPI_ERROR != MPI_SUCCESS) {
      reqs[i] = MPI_REQUEST_NULL;
      g_hb.peer[i].broken = 1;
    } else {
      g_hb.done[ok++] = i;
    }
  }
  return ok;
}

/* Take every message that has arrived. */
static void receive(void) {
  for (int n; (n = completed(g_hb.rreq)) > 0;) {
    for (int k = 0; k < n; k++) {
      const int i = g_hb.done[k];
      hb_peer *p = &g_hb.peer[i];
      pthread_mutex_lock(&g_hb.lock);
      p->heard = tsr_now();
      if (p->rbuf.kind == BYE) {
        p->bye = 1;
      } else {
        p->got = 1;
        p->last = p->rbuf.self;
        if (!g_hb.hub) { /* rank 0's view of the job */
          g_hb.suspect = p->rbuf.suspect;
          g_hb.suspect_silent_s = p->rbuf.suspect_silent_s;
          g_hb.suspect_at = p->heard;
          g_hb.suspect_state = p->rbuf.suspect_state;
          memcpy(g_hb.suspect_host, p->rbuf.suspect_host, HOST_LEN);
          g_hb.suspect_host[HOST_LEN - 1] = 0;
        }
      }
      pthread_mutex_unlock(&g_hb.lock);
      if (!p->bye) post_recv(i);
    }
  }
}

/* Rank 0: the peer the job seems to wait for — the one heard from least recently if it is
 * late (more than two intervals), else the first one outside MPI inside an activity; -1
 * for none.  Under the lock. */
static int pick_suspect(double now, double *silent) {
  int who = -1;
  *silent = 0;
  for (int i = 0; i < g_hb.n_peers; i++) {
    const hb_peer *p = &g_hb.peer[i];
    const double s = now - p->heard;
    if (!p->bye && s > 2 * g_hb.interval_s && s > *silent) who = i, *silent = s;
  }
  for (int i = 0; who < 0 && i < g_hb.n_peers; i++) {
    const hb_peer *p = &g_hb.peer[i];
    if (!p->bye && p->got && p->last.active && !p->last.blocked) {
      who = i;
      *silent = now - p->heard;
    }
  }
  return who;
}

/* Start a send of m to peer i unless its last send is still pending (the beat is then
 * skipped; call completed(g_hb.sreq) first to retire the sends that are done).  Returns 1
 * when the message went out. */
static int send_to(int i, const hb_msg *m) {
  hb_peer *p = &g_hb.peer[i];
  if (p->broken || g_hb.sreq[i] != MPI_REQUEST_NULL) return 0;
  p->sbuf = *m;
  if (MPI_Isend(&p->sbuf, (int)sizeof p->sbuf, MPI_BYTE, p->rank, TAG, g_hb.comm,
                &g_hb.sreq[i]) != MPI_SUCCESS) {
    g_hb.sreq[i] = MPI_REQUEST_NULL;
    p->broken = 1;
    return 0;
  }
  return 1;
}

static void beat(void) {
  hb_msg m;
  memset(&m, 0, sizeof m);
  m.kind = BEAT;
  m.suspect = -1;
  tsr_watchdog_state_now(&m.self);
  if (g_hb.hub) {
    pthread_mutex_lock(&g_hb.lock);
    const int who = pick_suspect(tsr_now(), &m.suspect_silent_s);
    if (who >= 0) {
      m.suspect = g_hb.peer[who].rank;
      m.suspect_state = g_hb.peer[who].last;
      memcpy(m.suspect_host, g_hb.peer[who].host, HOST_LEN);
    }
    pthread_mutex_unlock(&g_hb.lock);
  }
  completed(g_hb.sreq);
  for (int i = 0; i < g_hb.n_peers; i++)
    if (!g_hb.peer[i].bye) send_to(i, &m);
}

/* What a peer's last heartbeat said, as a phrase; under the lock. */
static void last_words(const hb_peer *p, char *buf, size_t len) {
  if (!p->got) {
    snprintf(buf, len, "no heartbeat came from it since the start");
    return;
  }
  char st[320];
  tsr_watchdog_state_text(&p->last, st, sizeof st);
  snprintf(buf, len, "its last heartbeat had it %s", st);
}

static void report_and_abort(int who, double silent) {
  char words[400], also[400] = "";
  pthread_mutex_lock(&g_hb.lock);
  const hb_peer *p = &g_hb.peer[who];
  last_words(p, words, sizeof words);
  size_t n = 0;
  int more = 0;
  const double now = tsr_now();
  for (int i = 0; i < g_hb.n_peers; i++) { /* a lost node takes several ranks with it */
    const hb_peer *q = &g_hb.peer[i];
    if (i == who || q->bye || now - q->heard <= g_hb.timeout_s) continue;
    if (n + 80 < sizeof also)
      n += (size_t)snprintf(also + n, sizeof also - n, "%s%d (%s)", n ? ", " : "", q->rank,
                            q->host);
    else
      more++;
  }
  if (more) snprintf(also + n, sizeof also - n, " and %d more", more);
  tsr_error("heartbeat: rank %d (host %s) has not been heard from for %.1f s (run.heartbeat_s "
            "= %g): it died or stopped responding; %s%s%s; aborting the job with MPI_Abort "
            "(exit code 4)", p->rank, p->host, silent, g_hb.timeout_s, words,
            n ? "; not heard from either: ranks " : "", also);
  pthread_mutex_unlock(&g_hb.lock);
  fflush(stdout);
  MPI_Abort(MPI_COMM_WORLD, TSR_ERR_WATCHDOG);
  _exit(TSR_ERR_WATCHDOG);
}

/* A watched peer silent past the timeout ends the job.  A silent rank 0 is reported by
 * rank 1 at the timeout and by the other ranks only half a timeout later, so that one line
 * names it. */
static void check_silence(void) {
  const double now = tsr_now(), limit = g_hb.timeout_s * (g_hb.hub || g_hb.rank == 1 ? 1 : 1.5);
  int who = -1;
  double worst = 0;
  pthread_mutex_lock(&g_hb.lock);
  for (int i = 0; i < g_hb.n_peers; i++) {
    const double s = now - g_hb.peer[i].heard;
    if (!g_hb.peer[i].bye && s > limit && s > worst) who = i, worst = s;
  }
  pthread_mutex_unlock(&g_hb.lock);
  if (who >= 0) report_and_abort(who, worst);
}

/* The watchdog's question (watchdog.h): whom is the job waiting for? */
static int describe_peers(char *buf, size_t len) {
  const double now = tsr_now();
  char words[400];
  int rank = -1, late = 0;
  double silent = 0;
  const char *host = "?";
  pthread_mutex_lock(&g_hb.lock);
  if (g_hb.hub) {
    const int who = pick_suspect(now, &silent);
    if (who >= 0) {
      rank = g_hb.peer[who].rank;
      host = g_hb.peer[who].host;
      last_words(&g_hb.peer[who], words, sizeof words);
    }
  } else if (!g_hb.peer[0].bye && now - g_hb.peer[0].heard > 2 * g_hb.interval_s) {
    rank = 0; /* rank 0 itself is late */
    host = g_hb.peer[0].host;
    silent = now - g_hb.peer[0].heard;
    last_words(&g_hb.peer[0], words, sizeof words);
  } else if (g_hb.suspect >= 0 && g_hb.suspect != g_hb.rank) {
    rank = g_hb.suspect;
    host = g_hb.suspect_host;
    silent = g_hb.suspect_silent_s + (now - g_hb.suspect_at);
    char st[320];
    tsr_watchdog_state_text(&g_hb.suspect_state, st, sizeof st);
    snprintf(words, sizeof words, "its last heartbeat had it %s", st);
  }
  late = silent > 2 * g_hb.interval_s;
  if (rank >= 0 && late)
    snprintf(buf, len, "rank %d (host %s) has not been heard from for %.1f s; %s", rank, host,
             silent, words);
  else if (rank >= 0)
    snprintf(buf, len, "rank %d (host %s) is outside MPI; %s", rank, host, words);
  pthread_mutex_unlock(&g_hb.lock);
  return rank >= 0;
}

static void cancel_receives(void) {
  for (int i = 0; i < g_hb.n_peers; i++)
    if (g_hb.rreq[i] != MPI_REQUEST_NULL) {
      MPI_Cancel(&g_hb.rreq[i]);
      MPI_Wait(&g_hb.rreq[i], MPI_STATUS_IGNORE);
    }
}

/* Every rank is past the last collective.  The others say goodbye to rank 0 and wait for
 * its goodbye; rank 0 waits for all of theirs (beating meanwhile, so that a rank still on
 * its way does not take it for dead), then says goodbye to all.  Every message is then
 * matched and the communicator can go.  Waits are bounded: a rank that died after the
 * last collective delays the end by one timeout, it does not hang it. */
static void farewell(void) {
  const double t0 = tsr_now();
  hb_msg bye;
  memset(&bye, 0, sizeof bye);
  bye.kind = BYE;
  bye.suspect = -1;
  if (!g_hb.hub) {
    hb_peer *p = &g_hb.peer[0];
    while (completed(g_hb.sreq), !send_to(0, &bye) && !p->broken && tsr_now() - t0 < 1)
      usleep(1000);
    while (!p->bye && !p->broken && tsr_now() - t0 < 2 * g_hb.timeout_s + 1) {
      receive();
      usleep(1000);
    }
  } else {
    double next = t0;
    for (;;) {
      receive();
      int waiting = 0;
      for (int i = 0; i < g_hb.n_peers; i++) waiting += !g_hb.peer[i].bye && !g_hb.peer[i].broken;
      const double now = tsr_now();
      if (!waiting || now - t0 > g_hb.timeout_s) break;
      if (now >= next) beat(), next = now + g_hb.interval_s;
      usleep(1000);
    }
    const double t1 = tsr_now(); /* each peer's goodbye goes out after its last beat */
    for (int left = 1; left && tsr_now() - t1 < 1; usleep(1000)) {
      completed(g_hb.sreq);
      left = 0;
      for (int i = 0; i < g_hb.n_peers; i++)
        if (!g_hb.peer[i].broken && g_hb.peer[i].sbuf.kind != BYE)
          left += !send_to(i, &bye);
    }
  }
  const double t2 = tsr_now(); /* the sends done, or given up on after 1 s */
  for (int left = 1; left && tsr_now() - t2 < 1; usleep(1000)) {
    completed(g_hb.sreq);
    left = 0;
    for (int i = 0; i < g_hb.n_peers; i++) left += g_hb.sreq[i] != MPI_REQUEST_NULL;
  }
  for (int i = 0; i < g_hb.n_peers; i++)
    if (g_hb.sreq[i] != MPI_REQUEST_NULL) MPI_Request_free(&g_hb.sreq[i]);
  cancel_receives();
}

/* The time this thread itself did not run (the process was stopped, or starved of the
 * CPU) is nobody's silence: it is added to every peer's last-heard time, so that ranks
 * stopped and continued together, or an observer that was descheduled, accuse no one. */
static void forgive(double gap) {
  pthread_mutex_lock(&g_hb.lock);
  for (int i = 0; i < g_hb.n_peers; i++) g_hb.peer[i].heard += gap;
  pthread_mutex_unlock(&g_hb.lock);
}

static void *run(void *arg) {
  (void)arg;
  double next = 0, last = tsr_now();
  while (!atomic_load(&g_hb.stop)) {
    const double gap = tsr_now() - last - 1e-6 * g_hb.poll_us;
    if (gap > g_hb.interval_s) forgive(gap);
    last = tsr_now();
    receive();
    const double now = tsr_now();
    if (now >= next) {
      beat();
      next = now + g_hb.interval_s;
    }
    check_silence();
    usleep(g_hb.poll_us);
  }
  farewell();
  return NULL;
}

static void release(void) {
  cancel_receives(); /* those a start that failed left */
  if (g_hb.comm != MPI_COMM_NULL) MPI_Comm_free(&g_hb.comm);
  tsr_free(&g_hb.peer);
  tsr_free(&g_hb.rreq);
  tsr_free(&g_hb.sreq);
  tsr_free(&g_hb.done);
  tsr_free(&g_hb.status);
  g_hb.n_peers = 0;
}

int tsr_heartbeat_start(double timeout_s, int mpi_threads, MPI_Comm world) {
  int size, rank;
  MPI_Comm_size(world, &size);
  MPI_Comm_rank(world, &rank);
  if (timeout_s <= 0 || size < 2 || g_hb.running) return 0;
  if (!mpi_threads) {
    if (rank == 0)
      tsr_warn("run.heartbeat_s = %g, but MPI gave no MPI_THREAD_MULTIPLE: running without a "
               "heartbeat", timeout_s);
    return 0;
  }
  g_hb.timeout_s = timeout_s;
  /* four beats per timeout, at most one a second; the thread looks for messages four
   * times per beat, at most every 0.1 s and at least every 1 ms */
  g_hb.interval_s = timeout_s / 4 < 1 ? timeout_s / 4 : 1;
  const double poll_s = g_hb.interval_s / 4 < 0.1 ? g_hb.interval_s / 4 : 0.1;
  g_hb.poll_us = (useconds_t)(poll_s > 0.001 ? 1e6 * poll_s : 1000);
  g_hb.rank = rank;
  g_hb.hub = rank == 0;
  g_hb.suspect = -1;
  int ok = MPI_Comm_dup(world, &g_hb.comm) == MPI_SUCCESS;
  if (ok) MPI_Comm_set_errhandler(g_hb.comm, MPI_ERRORS_RETURN);
  /* host names: rank 0 learns every rank's, the others rank 0's */
  char me[HOST_LEN] = "?", *all = rank == 0 ? tsr_calloc((size_t)size, HOST_LEN) : NULL;
  gethostname(me, HOST_LEN - 1);
  MPI_Gather(me, HOST_LEN, MPI_CHAR, all, HOST_LEN, MPI_CHAR, 0, world);
  char hub_host[HOST_LEN];
  memcpy(hub_host, me, HOST_LEN);
  MPI_Bcast(hub_host, HOST_LEN, MPI_CHAR, 0, world);
  const size_t n = (size_t)(g_hb.hub ? size - 1 : 1);
  g_hb.peer = tsr_calloc(n, sizeof *g_hb.peer);
  g_hb.rreq = tsr_calloc(n, sizeof *g_hb.rreq);
  g_hb.sreq = tsr_calloc(n, sizeof *g_hb.sreq);
  g_hb.done = tsr_calloc(n, sizeof *g_hb.done);
  g_hb.status = tsr_calloc(n, sizeof *g_hb.status);
  ok = ok && g_hb.peer && g_hb.rreq && g_hb.sreq && g_hb.done && g_hb.status &&
       (!g_hb.hub || all);
  g_hb.n_peers = g_hb.rreq && g_hb.sreq ? (int)n : 0;
  for (int i = 0; i < g_hb.n_peers; i++) g_hb.rreq[i] = g_hb.sreq[i] = MPI_REQUEST_NULL;
  const double now = tsr_now();
  for (int i = 0; ok && i < g_hb.n_peers; i++) {
    hb_peer *p = &g_hb.peer[i];
    p->rank = g_hb.hub ? i + 1 : 0;
    memcpy(p->host, g_hb.hub ? all + (size_t)p->rank * HOST_LEN : hub_host, HOST_LEN);
    p->host[HOST_LEN - 1] = 0;
    p->heard = now;
    post_recv(i);
    ok = !p->broken;
  }
  tsr_free(&all);
  atomic_store(&g_hb.stop, 0);
  ok = ok && pthread_create(&g_hb.thread, NULL, run, NULL) == 0;
  if (ok) pthread_setname_np(g_hb.thread, "tsr-heartbeat"); /* as top -H and ps show it */
  int all_ok = ok;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, world);
  if (ok) g_hb.running = 1;
  if (!all_ok) { /* the threads that did start end at once: nobody will beat */
    tsr_error("cannot start the heartbeat on %s", ok ? "another rank" : "this rank");
    tsr_heartbeat_stop();
    release();
    return TSR_ERR;
  }
  tsr_watchdog_set_peers(describe_peers);
  tsr_log("heartbeat: every %.2f s between rank 0 and each rank; a rank not heard from for %g s "
          "ends the job (run.heartbeat_s)", g_hb.interval_s, timeout_s);
  return 0;
}

void tsr_heartbeat_stop(void) {
  if (!g_hb.running) return;
  tsr_watchdog_set_peers(NULL);
  atomic_store(&g_hb.stop, 1);
  pthread_join(g_hb.thread, NULL);
  g_hb.running = 0;
  release();
}
