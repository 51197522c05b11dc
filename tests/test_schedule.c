/* test_schedule.c — pipeline schedules without a model: for gpipe, 1f1b and interleaved,
 * pp = 1..4, micro-batches 1..8, virtual stages 1..2, build every stage's list and check
 *   - structure: each (mb, chunk) has one FORWARD and one BACKWARD, on stage chunk % pp,
 *     forward first; every consumed message is received before use, every produced one
 *     sent after it is produced, each SEND has exactly one matching RECV;
 *   - a rendezvous replay (a send waits for its receive and vice versa, MPI_Ssend-like)
 *     finishes without deadlock and honours every dependency between computations;
 *   - an eager replay (sends buffered, receives waited for just before use: what the
 *     executor does) gives each stage's idle fraction; with forward = backward = 1 and
 *     with backward = 2 forward it must equal tsr_pp_ideal_bubble exactly;
 *   - peak activations in flight: 1F1B min(m, pp - stage), GPipe m.
 * The replays know nothing of how pipeline.c built the lists: they only run them.  As a
 * control, the same compute order with transfers placed next to their computations must
 * deadlock under rendezvous, and a list with one receive dropped must fail the structure
 * check: otherwise these checks could not fail. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "testutil.h"
#include "util.h"

#define MAX_PP 8

/* A message is named by its direction and the chunk that receives it. */
static int is_send(tsr_pp_op op) { return op == TSR_PP_SEND_ACT || op == TSR_PP_SEND_GRAD; }
static int is_recv(tsr_pp_op op) { return op == TSR_PP_RECV_ACT || op == TSR_PP_RECV_GRAD; }
static int message(const tsr_pp_action *a, int m, int C) {
  switch (a->op) {
  case TSR_PP_SEND_ACT: return a->micro_batch * C + a->chunk + 1;
  case TSR_PP_RECV_ACT: return a->micro_batch * C + a->chunk;
  case TSR_PP_SEND_GRAD: return m * C + a->micro_batch * C + a->chunk - 1;
  case TSR_PP_RECV_GRAD: return m * C + a->micro_batch * C + a->chunk;
  default: return -1;
  }
}

/* ---- structure ---------------------------------------------------------------------- */

static int check_structure(tsr_pp_schedule **S, int pp, int m, int v, char *why, size_t len) {
  int C = pp * v, ok = 1;
  int *n_f = calloc((size_t)m * C, sizeof(int)), *n_b = calloc((size_t)m * C, sizeof(int));
  int *n_send = calloc((size_t)2 * m * C, sizeof(int)),
      *n_recv = calloc((size_t)2 * m * C, sizeof(int));
#define BAD(...)                             \
  do {                                       \
    if (ok) snprintf(why, len, __VA_ARGS__); \
    ok = 0;                                  \
  } while (0)
  for (int s = 0; s < pp; s++) {
    /* position of each action kind per (mb, chunk) in this list, -1 if absent */
    int *pos[6];
    for (int o = 0; o < 6; o++) {
      pos[o] = malloc(sizeof(int) * (size_t)m * C);
      for (int i = 0; i < m * C; i++) pos[o][i] = -1;
    }
    for (int k = 0; k < S[s]->n; k++) {
      const tsr_pp_action *a = &S[s]->a[k];
      int c = a->chunk, mb = a->micro_batch;
      if (mb < 0 || mb >= m || c < 0 || c >= C || c % pp != s || (unsigned)a->op > 5) {
        BAD("stage %d action %d: %s mb %d chunk %d not owned by the stage", s, k,
            tsr_pp_op_name(a->op), mb, c);
        continue;
      }
      int i = mb * C + c, want_peer = -1;
      if (a->op == TSR_PP_RECV_ACT || a->op == TSR_PP_SEND_GRAD)
        want_peer = c > 0 ? (c - 1) % pp : -2;
      if (a->op == TSR_PP_SEND_ACT || a->op == TSR_PP_RECV_GRAD)
        want_peer = c < C - 1 ? (c + 1) % pp : -2;
      if (a->peer != want_peer)
        BAD("stage %d: %s mb %d chunk %d has peer %d, expected %d (-2: no such transfer)", s,
            tsr_pp_op_name(a->op), mb, c, a->peer, want_peer);
      if (pos[a->op][i] >= 0)
        BAD("stage %d: %s mb %d chunk %d twice", s, tsr_pp_op_name(a->op), mb, c);
      pos[a->op][i] = k;
      if (a->op == TSR_PP_FORWARD) n_f[i]++;
      if (a->op == TSR_PP_BACKWARD) n_b[i]++;
      if (is_send(a->op)) n_send[message(a, m, C)]++;
      if (is_recv(a->op)) n_recv[message(a, m, C)]++;
    }
    for (int mb = 0; mb < m; mb++)
      for (int c = s; c < C; c += pp) {
        int i = mb * C + c, f = pos[TSR_PP_FORWARD][i], b = pos[TSR_PP_BACKWARD][i];
        if (f < 0 || b < 0 || f > b)
          BAD("stage %d mb %d chunk %d: forward at %d, backward at %d", s, mb, c, f, b);
        if (c > 0 && !(pos[TSR_PP_RECV_ACT][i] >= 0 && pos[TSR_PP_RECV_ACT][i] < f))
          BAD("stage %d mb %d chunk %d: activation not received before forward", s, mb, c);
        if (c < C - 1 && !(pos[TSR_PP_SEND_ACT][i] > f))
          BAD("stage %d mb %d chunk %d: activation not sent after forward", s, mb, c);
        if (c < C - 1 && !(pos[TSR_PP_RECV_GRAD][i] >= 0 && pos[TSR_PP_RECV_GRAD][i] < b))
          BAD("stage %d mb %d chunk %d: gradient not received before backward", s, mb, c);
        if (c > 0 && !(pos[TSR_PP_SEND_GRAD][i] > b))
          BAD("stage %d mb %d chunk %d: gradient not sent after backward", s, mb, c);
      }
    for (int o = 0; o < 6; o++) free(pos[o]);
  }
  for (int i = 0; i < m * C; i++)
    if (n_f[i] != 1 || n_b[i] != 1)
      BAD("mb %d chunk %d: %d forwards, %d backwards", i / C, i % C, n_f[i], n_b[i]);
  for (int i = 0; i < 2 * m * C; i++) {
    int c = i % C, grad = i >= m * C, exists = grad ? c < C - 1 : c > 0;
    if (n_send[i] != exists || n_recv[i] != exists)
      BAD("%s message to mb %d chunk %d: %d sends, %d receives, expected %d",
          grad ? "gradient" : "activation", (i % (m * C)) / C, c, n_send[i], n_recv[i], exists);
  }
#undef BAD
  free(n_f);
  free(n_b);
  free(n_send);
  free(n_recv);
  return ok;
}

/* ---- replay ------------------------------------------------------------------------- */

typedef struct {
  int deadlock;        /* no stage could move while some had actions left */
  int dependency_ok;   /* every computation started after its inputs were computed */
  double makespan;     /* step time: until the last stage finishes */
  double idle[MAX_PP]; /* makespan - time spent in FORWARD / BACKWARD */
  char why[256];
} replay;

/* rendezvous = 1: a SEND and its RECV complete together, when both stages reach them.
 * rendezvous = 0: a SEND completes at once (buffered); a RECV only posts, and the
 * computation that consumes the message waits until it was sent.  Transfers take no
 * time; FORWARD takes t_f, BACKWARD t_b.  Times are small integers, so exact. */
static void run_replay(tsr_pp_schedule **S, int pp, int m, int v, double t_f, double t_b,
                       int rendezvous, replay *r) {
  int C = pp * v, pos[MAX_PP] = {0}, left = 0;
  double clock[MAX_PP] = {0}, busy[MAX_PP] = {0};
  double *sent = malloc(sizeof(double) * 2 * (size_t)m * C);
  double *start[2], *end[2];
  for (int d = 0; d < 2; d++) {
    start[d] = malloc(sizeof(double) * (size_t)m * C);
    end[d] = malloc(sizeof(double) * (size_t)m * C);
    for (int i = 0; i < m * C; i++) start[d][i] = end[d][i] = -1;
  }
  for (int i = 0; i < 2 * m * C; i++) sent[i] = -1;
  for (int s = 0; s < pp; s++) left += S[s]->n;
  memset(r, 0, sizeof *r);
  for (int progress = 1; left > 0 && progress;) {
    progress = 0;
    for (int s = 0; s < pp; s++) {
      while (pos[s] < S[s]->n) {
        const tsr_pp_action *a = &S[s]->a[pos[s]];
        int i = a->micro_batch * C + a->chunk;
        if (a->op == TSR_PP_FORWARD || a->op == TSR_PP_BACKWARD) {
          int d = a->op == TSR_PP_BACKWARD, input = -1;
          if (!rendezvous && d == 0 && a->chunk > 0) input = i;
          if (!rendezvous && d == 1 && a->chunk < C - 1) input = m * C + i;
          if (input >= 0 && sent[input] < 0) break; /* waits for its message */
          if (input >= 0 && sent[input] > clock[s]) clock[s] = sent[input];
          start[d][i] = clock[s];
          clock[s] += d ? t_b : t_f;
          busy[s] += d ? t_b : t_f;
          end[d][i] = clock[s];
        } else if (!rendezvous) {
          if (is_send(a->op)) sent[message(a, m, C)] = clock[s];
        } else {
          int p = a->peer;
          if (p < 0 || p >= pp || pos[p] >= S[p]->n) break;
          const tsr_pp_action *b = &S[p]->a[pos[p]];
          if (!(b->peer == s && message(b, m, C) == message(a, m, C) &&
                is_send(a->op) == is_recv(b->op) && (is_send(b->op) || is_recv(b->op))))
            break; /* the peer is not at the matching action yet */
          double t = clock[s] > clock[p] ? clock[s] : clock[p];
          clock[s] = clock[p] = t;
          pos[p]++;
          left--;
        }
        pos[s]++;
        left--;
        progress = 1;
      }
    }
  }
  if (left > 0) {
    r->deadlock = 1;
    int n = snprintf(r->why, sizeof r->why, "stuck at");
    for (int s = 0; s < pp && n < (int)sizeof r->why; s++) {
      if (pos[s] >= S[s]->n) continue;
      const tsr_pp_action *a = &S[s]->a[pos[s]];
      n += snprintf(r->why + n, sizeof r->why - (size_t)n, " [stage %d %s mb %d chunk %d]", s,
                    tsr_pp_op_name(a->op), a->micro_batch, a->chunk);
    }
  }
  r->dependency_ok = !r->deadlock;
  for (int i = 0; i < m * C && r->dependency_ok; i++) {
    int c = i % C;
    if ((c > 0 && start[0][i] < end[0][i - 1]) || (c < C - 1 && start[1][i] < end[1][i + 1]) ||
        (c == C - 1 && start[1][i] < end[0][i])) {
      r->dependency_ok = 0;
      snprintf(r->why, sizeof r->why, "mb %d chunk %d started before its input existed", i / C, c);
    }
  }
  for (int s = 0; s < pp; s++)
    if (clock[s] > r->makespan) r->makespan = clock[s];
  for (int s = 0; s < pp; s++) r->idle[s] = r->makespan - busy[s];
  free(sent);
  for (int d = 0; d < 2; d++) {
    free(start[d]);
    free(end[d]);
  }
}

/* ---- the sweep ---------------------------------------------------------------------- */

static const char *kinds[] = {"gpipe", "1f1b", "interleaved"}; /* tsr_schedule_choice order */
/* The kind of a name; an unknown name gives a value outside the enum (refused). */
static tsr_schedule_choice K(const char *kind) {
  for (int k = 0; k < 3; k++)
    if (!strcmp(kind, kinds[k])) return (tsr_schedule_choice)k;
  return (tsr_schedule_choice)7;
}

static int build(tsr_pp_schedule **S, const char *kind, int pp, int m, int v) {
  for (int s = 0; s < pp; s++) S[s] = NULL;
  for (int s = 0; s < pp; s++) TSR_CALL(tsr_pp_schedule_create(&S[s], K(kind), pp, s, m, v));
  return 0;
}

static void destroy(tsr_pp_schedule **S, int pp) {
  for (int s = 0; s < pp; s++) tsr_pp_schedule_destroy(&S[s]);
}

static void check_config(const char *kind, int pp, int m, int v) {
  tsr_pp_schedule *S[MAX_PP];
  char tag[96], why[256] = "";
  snprintf(tag, sizeof tag, "%s pp=%d m=%d v=%d", kind, pp, m, v);
  if (build(S, kind, pp, m, v) != 0) {
    TU_CHECK(0, "%s: schedules created", tag);
    destroy(S, pp);
    return;
  }
  int ok = check_structure(S, pp, m, v, why, sizeof why);
  TU_CHECK(ok,
           "%s: structure (one F and one B per (mb, chunk), F before B, recv before use, "
           "send after produce, sends == receives) %s",
           tag, why);

  /* Rendezvous: the strong no-deadlock property; the times are only reported. */
  replay blocking, blocking12, eager, eager12;
  run_replay(S, pp, m, v, 1, 1, 1, &blocking);
  run_replay(S, pp, m, v, 1, 2, 1, &blocking12);
  run_replay(S, pp, m, v, 1, 1, 0, &eager);
  run_replay(S, pp, m, v, 1, 2, 0, &eager12);
  TU_CHECK(!blocking.deadlock && blocking.dependency_ok && !blocking12.deadlock &&
               blocking12.dependency_ok && !eager.deadlock && eager.dependency_ok &&
               !eager12.deadlock && eager12.dependency_ok && blocking.makespan >= eager.makespan &&
               blocking12.makespan >= eager12.makespan,
           "%s: no deadlock, dependencies kept; makespan rendezvous %g / eager %g (F=B=1), "
           "rendezvous %g / eager %g (B=2F) %s%s%s%s",
           tag, blocking.makespan, eager.makespan, blocking12.makespan, eager12.makespan,
           blocking.why, blocking12.why, eager.why, eager12.why);

  /* Bubble: with fixed F and B per chunk and free transfers the formula is exact
   * (pipeline.c): every stage idles (p - 1)(F + B) / v.  F = B = 1 and B = 2F are small
   * integers, so the replay's times are exact and the comparison is to rounding only. */
  double ideal = tsr_pp_ideal_bubble(K(kind), pp, m, v), worst = 0, worst12 = 0;
  for (int s = 0; s < pp; s++) {
    double d = fabs(eager.idle[s] / eager.makespan - ideal);
    double d12 = fabs(eager12.idle[s] / eager12.makespan - ideal);
    if (d > worst) worst = d;
    if (d12 > worst12) worst12 = d12;
  }
  TU_CHECK(worst < 1e-12 && worst12 < 1e-12,
           "%s: bubble with F=B=1 %.4f (stage 0) vs ideal %.4f, max |diff| %.2e "
           "over stages; with B=2F %.4f, max |diff| %.2e",
           tag, eager.idle[0] / eager.makespan, ideal, worst, eager12.idle[0] / eager12.makespan,
           worst12);

  /* Activations in flight. */
  char peaks[64] = "";
  int n = 0, peak_ok = 1;
  for (int s = 0; s < pp; s++) {
    int peak = tsr_pp_peak_in_flight(S[s]), want = -1;
    if (!strcmp(kind, "gpipe"))
      want = m;
    else if (v == 1) /* 1f1b, or interleaved without virtual stages, which is 1f1b */
      want = m < pp - s ? m : pp - s;
    if (want >= 0 && peak != want) peak_ok = 0;
    n += snprintf(peaks + n, sizeof peaks - (size_t)n, "%s%d", s ? "," : "", peak);
  }
  TU_CHECK(peak_ok, "%s: peak in-flight per stage [%s]%s", tag, peaks,
           !strcmp(kind, "gpipe") ? " == m"
           : v == 1               ? " == min(m, pp - stage)"
                                  : " (reported)");
  destroy(S, pp);
}

/* The same compute order with each transfer placed next to its computation (receive
 * right before, send right after): fine for buffered sends, but under rendezvous 1F1B
 * deadlocks (pipeline.c explains why).  The replay must see that, or it checks nothing. */
static tsr_pp_schedule *local_placement(const tsr_pp_schedule *s) {
  int C = s->pp * s->v, n = 0;
  tsr_pp_schedule *t = calloc(1, sizeof *t);
  *t = *s;
  t->a = calloc((size_t)s->n, sizeof *t->a);
  for (int k = 0; k < s->n; k++) {
    tsr_pp_action a = s->a[k];
    int c = a.chunk, prev = (c - 1 + s->pp) % s->pp, next = (c + 1) % s->pp;
    if (a.op == TSR_PP_FORWARD) {
      if (c > 0) t->a[n++] = (tsr_pp_action){TSR_PP_RECV_ACT, a.micro_batch, c, prev};
      t->a[n++] = a;
      if (c < C - 1) t->a[n++] = (tsr_pp_action){TSR_PP_SEND_ACT, a.micro_batch, c, next};
    } else if (a.op == TSR_PP_BACKWARD) {
      if (c < C - 1) t->a[n++] = (tsr_pp_action){TSR_PP_RECV_GRAD, a.micro_batch, c, next};
      t->a[n++] = a;
      if (c > 0) t->a[n++] = (tsr_pp_action){TSR_PP_SEND_GRAD, a.micro_batch, c, prev};
    }
  }
  t->n = n;
  return t;
}

static void check_replay_detects_deadlock(const char *kind, int pp, int m, int v) {
  tsr_pp_schedule *S[MAX_PP], *L[MAX_PP];
  char why[256] = "";
  if (build(S, kind, pp, m, v) != 0) {
    TU_CHECK(0, "%s pp=%d m=%d v=%d: schedules created", kind, pp, m, v);
    destroy(S, pp);
    return;
  }
  for (int s = 0; s < pp; s++) L[s] = local_placement(S[s]);
  replay blocking, eager;
  run_replay(L, pp, m, v, 1, 1, 1, &blocking);
  run_replay(L, pp, m, v, 1, 1, 0, &eager);
  TU_CHECK(check_structure(L, pp, m, v, why, sizeof why) && blocking.deadlock && !eager.deadlock,
           "%s pp=%d m=%d v=%d with transfers placed locally: structure ok, eager replay "
           "finishes (%g), rendezvous replay deadlocks: %s",
           kind, pp, m, v, eager.makespan, blocking.why);
  /* and the structure check notices a missing receive */
  for (int k = 0; k < L[1]->n; k++)
    if (L[1]->a[k].op == TSR_PP_RECV_ACT) {
      memmove(&L[1]->a[k], &L[1]->a[k + 1], sizeof(tsr_pp_action) * (size_t)(L[1]->n - k - 1));
      L[1]->n--;
      break;
    }
  TU_CHECK(!check_structure(L, pp, m, v, why, sizeof why),
           "%s pp=%d m=%d v=%d with one RECV_ACT dropped: structure check fails (%s)", kind, pp,
           m, v, why);
  for (int s = 0; s < pp; s++) {
    free(L[s]->a);
    free(L[s]);
  }
  destroy(S, pp);
}

static int fails(const char *kind, int pp, int stage, int m, int v) {
  tsr_pp_schedule *s = NULL;
  int rc = tsr_pp_schedule_create(&s, K(kind), pp, stage, m, v);
  int ok = rc == TSR_ERR_INPUT && s == NULL;
  tsr_pp_schedule_destroy(&s);
  return ok;
}

int main(void) {
  for (int k = 0; k < 3; k++)
    for (int pp = 1; pp <= 4; pp++)
      for (int m = 1; m <= 8; m++)
        for (int v = 1; v <= 2; v++) {
          if (v == 2 && (k != 2 || pp == 1)) continue;
          if (v == 2 && m % pp) {
            TU_CHECK(fails(kinds[k], pp, 0, m, v),
                     "%s pp=%d m=%d v=%d: rejected with TSR_ERR_INPUT (m %% pp != 0)", kinds[k],
                     pp, m, v);
            continue;
          }
          check_config(kinds[k], pp, m, v);
        }

  /* A few deeper pipelines than the sweep: more stages, more chunks per stage. */
  check_config("1f1b", 8, 32, 1);
  check_config("gpipe", 8, 12, 1);
  check_config("interleaved", 8, 16, 4);
  check_config("interleaved", 4, 12, 3);
  check_config("interleaved", 3, 9, 5);

  TU_CHECK(fails("interleaved", 1, 0, 4, 2) && fails("1f1b", 4, 0, 8, 2) &&
               fails("gpipe", 2, 0, 4, 2) && fails("zigzag", 4, 0, 8, 1) &&
               fails("1f1b", 4, 4, 8, 1) && fails("1f1b", 4, 0, 0, 1),
           "bad arguments rejected with TSR_ERR_INPUT (pp=1 interleaved, v>1 without "
           "interleaving, unknown kind, stage out of range, m = 0)");

  check_replay_detects_deadlock("1f1b", 4, 8, 1);
  check_replay_detects_deadlock("interleaved", 4, 8, 2);

  /* Memory: what 1F1B buys over GPipe on the stage that holds the most. */
  tsr_pp_schedule *g = NULL, *f = NULL;
  int rc = tsr_pp_schedule_create(&g, TSR_SCHEDULE_GPIPE, 4, 0, 8, 1);
  if (rc == 0) rc = tsr_pp_schedule_create(&f, TSR_SCHEDULE_1F1B, 4, 0, 8, 1);
  int peak_g = rc ? -1 : tsr_pp_peak_in_flight(g), peak_f = rc ? -1 : tsr_pp_peak_in_flight(f);
  TU_CHECK(!rc && peak_f < peak_g && peak_f == 4 && peak_g == 8,
           "pp=4 m=8 stage 0: 1F1B holds %d micro-batches of activations, GPipe %d", peak_f,
           peak_g);
  tsr_pp_schedule_destroy(&g);
  tsr_pp_schedule_destroy(&f);

  /* Chunks: interleaving puts chunk c on stage c % pp and the layers tile the model. */
  int first, count, next = 0, tile_ok = 1;
  for (int c = 0; c < 8; c++) {
    if (tsr_pp_chunk_layers(24, 4, 2, c, &first, &count) || first != next || count != 3 ||
        tsr_pp_chunk_stage(4, c) != c % 4)
      tile_ok = 0;
    next = first + count;
  }
  TU_CHECK(tile_ok && next == 24,
           "24 layers, pp=4, v=2: 8 chunks of 3 layers, chunk c on stage c %% 4");
  TU_CHECK(tsr_pp_chunk_layers(26, 4, 2, 0, &first, &count) == TSR_ERR_INPUT,
           "26 layers over pp * v = 8 chunks rejected with TSR_ERR_INPUT");

  /* The formula itself, against hand values. */
  TU_CHECK(fabs(tsr_pp_ideal_bubble(K("1f1b"), 4, 8, 1) - 3.0 / 11) < 1e-15 &&
               fabs(tsr_pp_ideal_bubble(K("interleaved"), 4, 8, 2) - 3.0 / 19) < 1e-15 &&
               tsr_pp_ideal_bubble(K("gpipe"), 1, 5, 1) == 0 && tsr_pp_ideal_bubble(K("x"), 4, 8, 1) < 0,
           "ideal bubble: 1f1b pp=4 m=8 %.4f (3/11), interleaved v=2 %.4f (3/19)",
           tsr_pp_ideal_bubble(K("1f1b"), 4, 8, 1), tsr_pp_ideal_bubble(K("interleaved"), 4, 8, 2));
  return tu_summary("test_schedule");
}
