/* test_schedule.c — pipeline schedules without a model: for gpipe, 1f1b, interleaved,
 * zb_h1 and zb_v, pp = 1..4 (and 8), micro-batches 1..8 (and more), build every stage's
 * list and check
 *   - structure: each (mb, chunk) has one FORWARD and one BACKWARD (or one BACKWARD_B
 *     and one BACKWARD_W for the split kinds), on the chunk's owner (chunk % pp, or the
 *     V placement for zb_v), in the order F, B, W; every consumed message is received
 *     before use, every produced one sent after it is produced, each SEND has exactly
 *     one matching RECV, and chunks next to each other on one stage exchange nothing;
 *   - a rendezvous replay (a send waits for its receive and vice versa, MPI_Ssend-like)
 *     finishes without deadlock and honours every dependency between computations;
 *   - an eager replay (sends buffered, receives waited for just before use: what the
 *     executor does) gives each stage's idle fraction; with forward = backward = 1 and
 *     with backward = 2 forward (split kinds: F = B = W) it must equal
 *     tsr_pp_ideal_bubble exactly;
 *   - peak activations in flight: 1F1B min(m, pp - stage), GPipe m; zb_h1 at most
 *     min(m, pp) and zb_v at most 2 min(m, pp) half-size chunks, 1F1B's most (stage 0).
 * The replays know nothing of how pipeline.c built the lists: they only run them.  As a
 * control, the same compute order with transfers placed next to their computations must
 * deadlock under rendezvous, and a list with one receive dropped must fail the structure
 * check: otherwise these checks could not fail. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched/pipeline.h"
#include "sched/registry.h"
#include "testutil.h"
#include "core/util.h"

#define MAX_PP 8

static const char *kinds[] = {"gpipe", "1f1b", "interleaved", "zb_h1", "zb_v"}; /* enum order */
#define N_KINDS 5
static int is_split(tsr_schedule_choice k) {
  return k == TSR_SCHEDULE_ZB_H1 || k == TSR_SCHEDULE_ZB_V;
}
/* The stage holding chunk c, written out here rather than taken from pipeline.c: the V
 * of zb_v goes up the stages with chunks 0 .. pp - 1 and back down with the rest. */
static int owner(tsr_schedule_choice k, int pp, int c) {
  if (k == TSR_SCHEDULE_ZB_V && c >= pp) return 2 * pp - 1 - c;
  return c % pp;
}

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
  const tsr_schedule_choice kind = S[0]->kind;
  const int split = is_split(kind);
  /* the backward op(s) this kind must use, and the one it must not */
  const tsr_pp_op op_b = split ? TSR_PP_BACKWARD_B : TSR_PP_BACKWARD;
  int *n_w = calloc((size_t)m * C, sizeof(int));
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
    int *pos[8];
    for (int o = 0; o < 8; o++) {
      pos[o] = malloc(sizeof(int) * (size_t)m * C);
      for (int i = 0; i < m * C; i++) pos[o][i] = -1;
    }
    for (int k = 0; k < S[s]->n; k++) {
      const tsr_pp_action *a = &S[s]->a[k];
      int c = a->chunk, mb = a->micro_batch;
      if (mb < 0 || mb >= m || c < 0 || c >= C || owner(kind, pp, c) != s ||
          (unsigned)a->op > 7) {
        BAD("stage %d action %d: %s mb %d chunk %d not owned by the stage", s, k,
            tsr_pp_op_name(a->op), mb, c);
        continue;
      }
      int i = mb * C + c, want_peer = -1;
      /* -2: no such transfer (no neighbour chunk, or the neighbour is on this stage) */
      int prev = c > 0 && owner(kind, pp, c - 1) != s ? owner(kind, pp, c - 1) : -2;
      int next = c < C - 1 && owner(kind, pp, c + 1) != s ? owner(kind, pp, c + 1) : -2;
      if (a->op == TSR_PP_RECV_ACT || a->op == TSR_PP_SEND_GRAD) want_peer = prev;
      if (a->op == TSR_PP_SEND_ACT || a->op == TSR_PP_RECV_GRAD) want_peer = next;
      if ((a->op == TSR_PP_BACKWARD && split) ||
          ((a->op == TSR_PP_BACKWARD_B || a->op == TSR_PP_BACKWARD_W) && !split))
        BAD("stage %d: %s mb %d chunk %d in a %s schedule", s, tsr_pp_op_name(a->op), mb, c,
            kinds[kind]);
      if (a->peer != want_peer)
        BAD("stage %d: %s mb %d chunk %d has peer %d, expected %d (-2: no such transfer)", s,
            tsr_pp_op_name(a->op), mb, c, a->peer, want_peer);
      if (pos[a->op][i] >= 0)
        BAD("stage %d: %s mb %d chunk %d twice", s, tsr_pp_op_name(a->op), mb, c);
      pos[a->op][i] = k;
      if (a->op == TSR_PP_FORWARD) n_f[i]++;
      if (a->op == op_b) n_b[i]++;
      if (a->op == TSR_PP_BACKWARD_W) n_w[i]++;
      if (is_send(a->op)) n_send[message(a, m, C)]++;
      if (is_recv(a->op)) n_recv[message(a, m, C)]++;
    }
    for (int mb = 0; mb < m; mb++)
      for (int c = 0; c < C; c++) {
        if (owner(kind, pp, c) != s) continue;
        int i = mb * C + c, f = pos[TSR_PP_FORWARD][i], b = pos[op_b][i];
        int w = split ? pos[TSR_PP_BACKWARD_W][i] : b;
        if (f < 0 || b < 0 || w < 0 || f > b || b > w)
          BAD("stage %d mb %d chunk %d: forward at %d, backward (B) at %d, W at %d", s, mb,
              c, f, b, w);
        int remote_prev = c > 0 && owner(kind, pp, c - 1) != s;
        int remote_next = c < C - 1 && owner(kind, pp, c + 1) != s;
        if (remote_prev && !(pos[TSR_PP_RECV_ACT][i] >= 0 && pos[TSR_PP_RECV_ACT][i] < f))
          BAD("stage %d mb %d chunk %d: activation not received before forward", s, mb, c);
        if (remote_next && !(pos[TSR_PP_SEND_ACT][i] > f))
          BAD("stage %d mb %d chunk %d: activation not sent after forward", s, mb, c);
        if (remote_next && !(pos[TSR_PP_RECV_GRAD][i] >= 0 && pos[TSR_PP_RECV_GRAD][i] < b))
          BAD("stage %d mb %d chunk %d: gradient not received before backward", s, mb, c);
        if (remote_prev && !(pos[TSR_PP_SEND_GRAD][i] > b))
          BAD("stage %d mb %d chunk %d: gradient not sent after backward", s, mb, c);
        /* neighbours on this stage: no message, so the list itself must order them */
        if (c < C - 1 && !remote_next &&
            !(pos[TSR_PP_FORWARD][i + 1] > f && pos[op_b][i + 1] >= 0 && pos[op_b][i + 1] < b))
          BAD("stage %d mb %d chunks %d, %d on one stage: forward of %d not after forward "
              "of %d, or backward of %d not before backward of %d", s, mb, c, c + 1, c + 1, c,
              c + 1, c);
      }
    for (int o = 0; o < 8; o++) free(pos[o]);
  }
  for (int i = 0; i < m * C; i++)
    if (n_f[i] != 1 || n_b[i] != 1 || n_w[i] != split)
      BAD("mb %d chunk %d: %d forwards, %d backwards (B), %d W", i / C, i % C, n_f[i], n_b[i],
          n_w[i]);
  for (int i = 0; i < 2 * m * C; i++) {
    int c = i % C, grad = i >= m * C;
    /* a message to chunk c comes from chunk c - 1 (activation) or c + 1 (gradient) */
    int exists = grad ? c < C - 1 && owner(kind, pp, c + 1) != owner(kind, pp, c)
                      : c > 0 && owner(kind, pp, c - 1) != owner(kind, pp, c);
    if (n_send[i] != exists || n_recv[i] != exists)
      BAD("%s message to mb %d chunk %d: %d sends, %d receives, expected %d",
          grad ? "gradient" : "activation", (i % (m * C)) / C, c, n_send[i], n_recv[i], exists);
  }
#undef BAD
  free(n_f);
  free(n_b);
  free(n_w);
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
 * time; FORWARD takes t_f, BACKWARD_B t_b, BACKWARD_W t_w and BACKWARD t_b + t_w.  An
 * input made by a neighbour chunk on the same stage needs no message: it is there if
 * the stage computed it earlier in its list.  Times are small integers, so exact. */
static void run_replay(tsr_pp_schedule **S, int pp, int m, int v, double t_f, double t_b,
                       double t_w, int rendezvous, replay *r) {
  int C = pp * v, pos[MAX_PP] = {0}, left = 0;
  const tsr_schedule_choice kind = S[0]->kind;
  double clock[MAX_PP] = {0}, busy[MAX_PP] = {0};
  double *sent = malloc(sizeof(double) * 2 * (size_t)m * C);
  double *start[3], *end[3];
  for (int d = 0; d < 3; d++) {
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
        int i = a->micro_batch * C + a->chunk, c = a->chunk;
        if (a->op == TSR_PP_FORWARD || a->op == TSR_PP_BACKWARD ||
            a->op == TSR_PP_BACKWARD_B || a->op == TSR_PP_BACKWARD_W) {
          int d = a->op == TSR_PP_FORWARD ? 0 : a->op == TSR_PP_BACKWARD_W ? 2 : 1;
          int input = -1;  /* message waited for (eager replay) */
          double *local = NULL; /* or the same-stage result needed */
          if (d == 0 && c > 0) {
            if (owner(kind, pp, c - 1) != s) input = i;
            else local = &end[0][i - 1];
          }
          if (d == 1 && c < C - 1) {
            if (owner(kind, pp, c + 1) != s) input = m * C + i;
            else local = &end[1][i + 1];
          }
          if (d == 2) local = &end[1][i];
          if (local && *local < 0) break; /* never comes: this stage would hang */
          if (rendezvous) input = -1;
          if (input >= 0 && sent[input] < 0) break; /* waits for its message */
          if (input >= 0 && sent[input] > clock[s]) clock[s] = sent[input];
          double t = d == 0 ? t_f : d == 2 ? t_w : a->op == TSR_PP_BACKWARD ? t_b + t_w : t_b;
          start[d][i] = clock[s];
          clock[s] += t;
          busy[s] += t;
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
  /* F after the previous chunk's F; B after the next chunk's B (the last chunk's after
   * its own F); W after its own B */
  r->dependency_ok = !r->deadlock;
  for (int i = 0; i < m * C && r->dependency_ok; i++) {
    int c = i % C;
    if ((c > 0 && start[0][i] < end[0][i - 1]) || (c < C - 1 && start[1][i] < end[1][i + 1]) ||
        (c == C - 1 && start[1][i] < end[0][i]) ||
        (is_split(kind) && start[2][i] < end[1][i])) {
      r->dependency_ok = 0;
      snprintf(r->why, sizeof r->why, "mb %d chunk %d started before its input existed", i / C, c);
    }
  }
  for (int s = 0; s < pp; s++)
    if (clock[s] > r->makespan) r->makespan = clock[s];
  for (int s = 0; s < pp; s++) r->idle[s] = r->makespan - busy[s];
  free(sent);
  for (int d = 0; d < 3; d++) {
    free(start[d]);
    free(end[d]);
  }
}

/* ---- the sweep ---------------------------------------------------------------------- */

/* The kind of a name; an unknown name gives a value outside the enum (refused). */
static tsr_schedule_choice K(const char *kind) {
  for (int k = 0; k < N_KINDS; k++)
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
           "%s: structure (one F and one B%s per (mb, chunk) on its owner, in that order, "
           "recv before use, send after produce, sends == receives) %s",
           tag, is_split(K(kind)) ? " and one W" : "", why);

  /* Two timings (F, B, W), all small integers, so the replay's times are exact: fused
   * backward (B + W in one action) F = B and B = 2F; split F = B = W and B = 2F = 2W. */
  const int split = is_split(K(kind));
  const double t1[3] = {1, 1, split ? 1 : 0}, t2[3] = {1, split ? 2 : 1, 1};
  const char *n1 = split ? "F=B=W=1" : "F=B=1", *n2 = split ? "B=2F=2W" : "B=2F";

  /* Rendezvous: the strong no-deadlock property; the times are only reported. */
  replay blocking, blocking12, eager, eager12;
  run_replay(S, pp, m, v, t1[0], t1[1], t1[2], 1, &blocking);
  run_replay(S, pp, m, v, t2[0], t2[1], t2[2], 1, &blocking12);
  run_replay(S, pp, m, v, t1[0], t1[1], t1[2], 0, &eager);
  run_replay(S, pp, m, v, t2[0], t2[1], t2[2], 0, &eager12);
  TU_CHECK(!blocking.deadlock && blocking.dependency_ok && !blocking12.deadlock &&
               blocking12.dependency_ok && !eager.deadlock && eager.dependency_ok &&
               !eager12.deadlock && eager12.dependency_ok && blocking.makespan >= eager.makespan &&
               blocking12.makespan >= eager12.makespan,
           "%s: no deadlock, dependencies kept; makespan rendezvous %g / eager %g (%s), "
           "rendezvous %g / eager %g (%s) %s%s%s%s",
           tag, blocking.makespan, eager.makespan, n1, blocking12.makespan, eager12.makespan, n2,
           blocking.why, blocking12.why, eager.why, eager12.why);

  /* Bubble: with fixed times per chunk and free transfers the formulas are exact
   * (pipeline.c): for the fused kinds whatever F and B, for the split ones with
   * F = B = W, so only the first timing is compared there. */
  double ideal = tsr_pp_ideal_bubble(K(kind), pp, m, v), worst = 0, worst12 = 0;
  for (int s = 0; s < pp; s++) {
    double d = fabs(eager.idle[s] / eager.makespan - ideal);
    double d12 = fabs(eager12.idle[s] / eager12.makespan - ideal);
    if (d > worst) worst = d;
    if (d12 > worst12) worst12 = d12;
  }
  TU_CHECK(worst < 1e-12 && (split || worst12 < 1e-12),
           "%s: bubble with %s %.4f (stage 0) vs ideal %.4f, max |diff| %.2e "
           "over stages; with %s %.4f, max |diff| %.2e%s",
           tag, n1, eager.idle[0] / eager.makespan, ideal, worst, n2,
           eager12.idle[0] / eager12.makespan, worst12, split ? " (not compared)" : "");
  if (K(kind) == TSR_SCHEDULE_ZB_H1 && pp >= 2) {
    double f1b = tsr_pp_ideal_bubble(TSR_SCHEDULE_1F1B, pp, m, 1);
    TU_CHECK(eager.idle[0] / eager.makespan < f1b && ideal < f1b,
             "%s: bubble %.4f (replayed), %.4f (formula) below 1f1b's %.4f", tag,
             eager.idle[0] / eager.makespan, ideal, f1b);
  }

  /* Activations in flight.  The split kinds keep an activation set until W; their bound
   * is 1F1B's most, min(m, pp) micro-batches on stage 0, i.e. 2 min(m, pp) half-size
   * chunks for zb_v. */
  char peaks[64] = "";
  int n = 0, peak_ok = 1, bound = m < pp ? m : pp;
  if (K(kind) == TSR_SCHEDULE_ZB_V) bound *= 2;
  for (int s = 0; s < pp; s++) {
    int peak = tsr_pp_peak_in_flight(S[s]), want = -1;
    if (!strcmp(kind, "gpipe"))
      want = m;
    else if (split) {
      if (peak > bound) peak_ok = 0;
    } else if (v == 1) /* 1f1b, or interleaved without virtual stages, which is 1f1b */
      want = m < pp - s ? m : pp - s;
    if (want >= 0 && peak != want) peak_ok = 0;
    n += snprintf(peaks + n, sizeof peaks - (size_t)n, "%s%d", s ? "," : "", peak);
  }
  char split_bound[48];
  snprintf(split_bound, sizeof split_bound, " <= %d (1F1B's most)", bound);
  TU_CHECK(peak_ok, "%s: peak in-flight per stage [%s]%s", tag, peaks,
           !strcmp(kind, "gpipe") ? " == m"
           : split                ? split_bound
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
  run_replay(L, pp, m, v, 1, 1, 0, 1, &blocking);
  run_replay(L, pp, m, v, 1, 1, 0, 0, &eager);
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

/* ---- controls for the split kinds --------------------------------------------------- */

static tsr_pp_schedule *copy_list(const tsr_pp_schedule *s) {
  tsr_pp_schedule *t = calloc(1, sizeof *t);
  *t = *s;
  t->a = calloc((size_t)s->n, sizeof *t->a);
  memcpy(t->a, s->a, sizeof *t->a * (size_t)s->n);
  return t;
}

static void free_lists(tsr_pp_schedule **L, int pp) {
  for (int s = 0; s < pp; s++) {
    free(L[s]->a);
    free(L[s]);
  }
}

/* Index of the first action of stage list l with op and chunk (chunk < 0: any). */
static int find(const tsr_pp_schedule *l, tsr_pp_op op, int chunk) {
  for (int k = 0; k < l->n; k++)
    if (l->a[k].op == op && (chunk < 0 || l->a[k].chunk == chunk)) return k;
  return -1;
}

/* Moves action `from` of list l to position `to`, shifting the ones between. */
static void move(tsr_pp_schedule *l, int from, int to) {
  tsr_pp_action a = l->a[from];
  if (from < to)
    memmove(&l->a[from], &l->a[from + 1], sizeof a * (size_t)(to - from));
  else
    memmove(&l->a[to + 1], &l->a[to], sizeof a * (size_t)(from - to));
  l->a[to] = a;
}

/* Broken variants of good zb_h1 / zb_v lists must fail the checks that passed above,
 * or those checks could not fail: a W dropped, a W ahead of its B, the two chunks at
 * zb_v's bend run in the wrong order, and zb_h1 with every W held to the end of the
 * step (more in flight than 1F1B, and a bubble off the formula). */
static void check_split_controls(void) {
  const int pp = 4, m = 8;
  tsr_pp_schedule *S[MAX_PP], *L[MAX_PP];
  char why[256] = "";
  replay r;
  if (build(S, "zb_v", pp, m, 2) != 0) {
    TU_CHECK(0, "zb_v pp=%d m=%d: schedules created", pp, m);
    destroy(S, pp);
    return;
  }
  /* a W dropped */
  for (int s = 0; s < pp; s++) L[s] = copy_list(S[s]);
  int k = find(L[1], TSR_PP_BACKWARD_W, -1);
  move(L[1], k, L[1]->n - 1);
  L[1]->n--;
  TU_CHECK(!check_structure(L, pp, m, 2, why, sizeof why),
           "zb_v pp=%d m=%d with one BACKWARD_W dropped: structure check fails (%s)", pp, m,
           why);
  free_lists(L, pp);
  /* a W ahead of its B */
  for (int s = 0; s < pp; s++) L[s] = copy_list(S[s]);
  int kw = find(L[0], TSR_PP_BACKWARD_W, -1), kb = -1;
  for (int j = 0; j < L[0]->n; j++)
    if (L[0]->a[j].op == TSR_PP_BACKWARD_B && L[0]->a[j].chunk == L[0]->a[kw].chunk &&
        L[0]->a[j].micro_batch == L[0]->a[kw].micro_batch)
      kb = j;
  move(L[0], kw, kb);
  int structure_ok = check_structure(L, pp, m, 2, why, sizeof why);
  run_replay(L, pp, m, 2, 1, 1, 1, 0, &r);
  TU_CHECK(!structure_ok && (r.deadlock || !r.dependency_ok),
           "zb_v pp=%d m=%d with a W moved ahead of its B: structure check fails (%s), "
           "replay does not finish cleanly (%s)", pp, m, why, r.why);
  free_lists(L, pp);
  /* the bend: stage pp - 1's first forward of chunk pp moved ahead of chunk pp - 1's */
  for (int s = 0; s < pp; s++) L[s] = copy_list(S[s]);
  int f_up = find(L[pp - 1], TSR_PP_FORWARD, pp - 1), f_down = find(L[pp - 1], TSR_PP_FORWARD, pp);
  move(L[pp - 1], f_down, f_up);
  structure_ok = check_structure(L, pp, m, 2, why, sizeof why);
  run_replay(L, pp, m, 2, 1, 1, 1, 0, &r);
  TU_CHECK(!structure_ok && (r.deadlock || !r.dependency_ok),
           "zb_v pp=%d m=%d with chunk %d's forward ahead of chunk %d's on stage %d: "
           "structure check fails (%s), replay does not finish cleanly (%s)",
           pp, m, pp, pp - 1, pp - 1, why, r.why);
  free_lists(L, pp);
  destroy(S, pp);

  /* zb_h1 with all W's at the end of every list */
  if (build(S, "zb_h1", pp, m, 1) != 0) {
    TU_CHECK(0, "zb_h1 pp=%d m=%d: schedules created", pp, m);
    destroy(S, pp);
    return;
  }
  for (int s = 0; s < pp; s++) {
    L[s] = copy_list(S[s]);
    for (int j = 0, n = 0; j < L[s]->n - n;)
      if (L[s]->a[j].op == TSR_PP_BACKWARD_W) {
        move(L[s], j, L[s]->n - 1);
        n++;
      } else {
        j++;
      }
  }
  run_replay(L, pp, m, 1, 1, 1, 1, 0, &r);
  double ideal = tsr_pp_ideal_bubble(TSR_SCHEDULE_ZB_H1, pp, m, 1);
  TU_CHECK(check_structure(L, pp, m, 1, why, sizeof why) && !r.deadlock && r.dependency_ok &&
               tsr_pp_peak_in_flight(L[0]) > pp &&
               fabs(r.idle[0] / r.makespan - ideal) > 1e-3,
           "zb_h1 pp=%d m=%d with every W at the end: valid, but %d in flight on stage 0 "
           "(> %d) and bubble %.4f != %.4f", pp, m, tsr_pp_peak_in_flight(L[0]), pp,
           r.idle[0] / r.makespan, ideal);
  free_lists(L, pp);
  destroy(S, pp);
}

static int fails(const char *kind, int pp, int stage, int m, int v) {
  tsr_pp_schedule *s = NULL;
  int rc = tsr_pp_schedule_create(&s, K(kind), pp, stage, m, v);
  int ok = rc == TSR_ERR_INPUT && s == NULL;
  tsr_pp_schedule_destroy(&s);
  return ok;
}

/* The registry: its ids, the deck's words (TSR_SCHED_WORDS) and the descriptors agree, and
 * each descriptor is whole. */
static void check_registry(void) {
  const char *words = TSR_SCHED_WORDS;
  int bad = 0, n = 0;
  for (int k = 0; k < TSR_SCHEDULE_COUNT; k++, n++) {
    const tsr_sched_desc *d = tsr_sched(k);
    const size_t len = strcspn(words, "|");
    if (!d || strlen(d->word) != len || strncmp(d->word, words, len) ||
        !d->order || !d->bubble || !d->in_flight || !d->bubble_formula || d->min_pp < 1 ||
        (d->chunks > 1 && !d->chunks_why)) {
      printf("  registry entry %d (%.*s) disagrees with its descriptor\n", k, (int)len, words);
      bad++;
    }
    words += len + (words[len] == '|');
  }
  TU_CHECK(bad == 0 && !*words && !tsr_sched(TSR_SCHEDULE_COUNT) && !tsr_sched(-1),
           "registry: %d schedules, ids, deck words and descriptors in one order", n);
  TU_CHECK(tsr_sched_for(TSR_PLACE_ROUND, 1) == TSR_SCHEDULE_DEFAULT &&
               tsr_sched(tsr_sched_for(TSR_PLACE_ROUND, 3))->chunks == 0 &&
               tsr_sched(tsr_sched_for(TSR_PLACE_V, 2))->placement == TSR_PLACE_V,
           "registry: the schedule of a placement and a number of chunks");
}

int main(void) {
  check_registry();
  for (int k = 0; k < N_KINDS; k++)
    for (int pp = 1; pp <= 4; pp++)
      for (int m = 1; m <= 8; m++)
        for (int v = 1; v <= 2; v++) {
          if (k == TSR_SCHEDULE_ZB_V) { /* exactly two chunks per stage, two stages or more */
            if (v == 2 && pp >= 2) check_config(kinds[k], pp, m, v);
            continue;
          }
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

  /* The zero-bubble kinds at the sizes that matter: pp in {2, 3, 4, 8}, m in {pp, 2 pp,
   * 16} (structure, deadlock, bubble, memory, zb_h1 below 1f1b) ... */
  const int pps[] = {2, 3, 4, 8};
  for (int i = 0; i < 4; i++) {
    const int pp = pps[i], ms[] = {pp, 2 * pp, 16};
    for (int j = 0; j < 3; j++) {
      if ((pp <= 4 && ms[j] <= 8) || (j == 2 && ms[2] == ms[1])) continue; /* done */
      check_config("zb_h1", pp, ms[j], 1);
      check_config("zb_v", pp, ms[j], 2);
    }
  }
  /* ... and the replayed bubble against the formulas for pp in {2, 4, 8}, m in {4, 8,
   * 16, 32} for 1f1b, interleaved (v = 2, where m % pp == 0), zb_h1 and zb_v. */
  for (int pp = 2; pp <= 8; pp *= 2)
    for (int m = 4; m <= 32; m *= 2) {
      if (pp <= 4 && m <= 8) continue; /* in the sweep above */
      check_config("1f1b", pp, m, 1);
      if (m % pp == 0) check_config("interleaved", pp, m, 2);
      if (!(pp == 8 && (m == 8 || m == 16))) { /* those two are in the loop above */
        check_config("zb_h1", pp, m, 1);
        check_config("zb_v", pp, m, 2);
      }
    }

  TU_CHECK(fails("interleaved", 1, 0, 4, 2) && fails("1f1b", 4, 0, 8, 2) &&
               fails("gpipe", 2, 0, 4, 2) && fails("zigzag", 4, 0, 8, 1) &&
               fails("1f1b", 4, 4, 8, 1) && fails("1f1b", 4, 0, 0, 1),
           "bad arguments rejected with TSR_ERR_INPUT (pp=1 interleaved, v>1 without "
           "interleaving, unknown kind, stage out of range, m = 0)");
  TU_CHECK(fails("zb_v", 4, 0, 8, 1) && fails("zb_v", 4, 0, 8, 3) && fails("zb_v", 1, 0, 4, 2) &&
               fails("zb_h1", 4, 0, 8, 2) && fails("zb_h1", 2, 0, 0, 1),
           "zb_v with virtual_stages != 2 or pp = 1, zb_h1 with virtual_stages = 2 or m = 0: "
           "rejected with TSR_ERR_INPUT");

  check_replay_detects_deadlock("1f1b", 4, 8, 1);
  check_replay_detects_deadlock("interleaved", 4, 8, 2);
  check_split_controls();

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
  tsr_model_config lm = {.arch = TSR_ARCH_LLAMA, .n_layer = 24, .d_model = 128, .n_head = 4,
                         .n_kv_head = 4, .d_ff = 384, .vocab_size = 2048, .seq_len = 128};
  int first, count, next = 0, tile_ok = 1;
  for (int c = 0; c < 8; c++) {
    if (tsr_pp_chunk_layers(&lm, 4, 2, "", c, &first, &count) || first != next || count != 3 ||
        tsr_pp_chunk_owner(TSR_SCHEDULE_INTERLEAVED, 4, 2, c) != c % 4 || tsr_pp_layer_chunk(&lm, 4, 2, "", first + 2) != c)
      tile_ok = 0;
    next = first + count;
  }
  TU_CHECK(tile_ok && next == 24,
           "24 layers, pp=4, v=2: 8 chunks of 3 layers, chunk c on stage c %% 4");
  lm.n_layer = 26;
  TU_CHECK(tsr_pp_chunk_layers(&lm, 4, 2, "", 0, &first, &count) == TSR_ERR_INPUT,
           "26 layers over pp * v = 8 equal chunks rejected with TSR_ERR_INPUT");

  /* Uneven splits: an explicit list tiles the model in chunk order. */
  lm.n_layer = 7;
  const int want[4] = {2, 2, 2, 1};
  next = 0, tile_ok = 1;
  for (int c = 0; c < 4; c++) {
    if (tsr_pp_chunk_layers(&lm, 2, 2, " 2, 2,2 ,1", c, &first, &count) || first != next ||
        count != want[c] || tsr_pp_layer_chunk(&lm, 2, 2, "2,2,2,1", first) != c)
      tile_ok = 0;
    next = first + count;
  }
  TU_CHECK(tile_ok && next == 7 && tsr_pp_layer_chunk(&lm, 2, 2, "2,2,2,1", 7) == -1 &&
               tsr_pp_stage_max_chunk(&lm, TSR_SCHEDULE_INTERLEAVED, 2, 2, "2,2,2,1", 1) == 2 &&
               tsr_pp_stage_max_chunk(&lm, TSR_SCHEDULE_1F1B, 3, 1, "3,2,2", 0) == 3 &&
               tsr_pp_stage_max_chunk(&lm, TSR_SCHEDULE_ZB_V, 2, 2, "1,2,3,1", 0) == 1 &&
               tsr_pp_stage_max_chunk(&lm, TSR_SCHEDULE_ZB_V, 2, 2, "1,2,3,1", 1) == 3,
           "7 layers as '2,2,2,1': chunks [0,2) [2,4) [4,6) [6,7)");
  char why[256], text[160];
  int counts[TSR_PP_MAX_CHUNKS];
  text[0] = 0;
  TU_CHECK(!tsr_pp_split_text(&lm, TSR_SCHEDULE_INTERLEAVED, 2, 2, "2,2,2,1", text, sizeof text) &&
               !strcmp(text, "explicit split of the layers (parallel.stage_layers = '2,2,2,1'): "
                             "stage 0 holds layers 0..1 4..5, stage 1 layers 2..3 6"),
           "the split in words: %s", text);
  TU_CHECK(!tsr_pp_split_text(&lm, TSR_SCHEDULE_ZB_V, 2, 2, "2,2,2,1", text, sizeof text) &&
               !strcmp(text, "explicit split of the layers (parallel.stage_layers = '2,2,2,1'): "
                             "stage 0 holds layers 0..1 6, stage 1 layers 2..3 4..5"),
           "the V split in words: %s", text);
  static const char *bad[] = {"4,4", "4,2", "4,3,0", "4,-3", "4,,3", "4,3,", "four", "3,4,0"};
  int bad_ok = 1;
  for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
    const int pp = i == 2 || i == 7 ? 3 : 2;
    if (tsr_pp_split_counts(&lm, pp, 1, bad[i], counts, why, sizeof why) != TSR_ERR_INPUT) {
      bad_ok = 0;
      fprintf(stderr, "  accepted '%s' on pp %d\n", bad[i], pp);
    }
  }
  TU_CHECK(bad_ok, "wrong sum, wrong count, zero, negative, empty item, trailing comma, word "
                   "rejected");
  TU_CHECK(tsr_pp_split_counts(&lm, 8, 1, "auto", counts, why, sizeof why) == TSR_ERR_INPUT,
           "8 chunks for 7 layers rejected: %s", why);

  /* 'auto' on the tiny deck's shape: the head costs 2 V C = 524288 FLOPs per token, a layer
   * 2 (4 C^2 + 3 C F) + 2 T C = 458752, so the last chunk counts 1.14 layers extra. */
  TU_CHECK(!tsr_pp_split_counts(&lm, 2, 1, "auto", counts, why, sizeof why) && counts[0] == 4 &&
               counts[1] == 3,
           "auto, 7 layers on pp 2: %d,%d (4,3)", counts[0], counts[1]);
  TU_CHECK(!tsr_pp_split_counts(&lm, 3, 1, "auto", counts, why, sizeof why) && counts[0] == 3 &&
               counts[1] == 3 && counts[2] == 1,
           "auto, 7 layers on pp 3: %d,%d,%d (3,3,1)", counts[0], counts[1], counts[2]);
  TU_CHECK(!tsr_pp_split_counts(&lm, 2, 2, "auto", counts, why, sizeof why) && counts[0] == 2 &&
               counts[1] == 2 && counts[2] == 2 && counts[3] == 1,
           "auto, 7 layers on pp 2 x v 2: %d,%d,%d,%d (2,2,2,1)", counts[0], counts[1],
           counts[2], counts[3]);
  lm.n_layer = 8;
  TU_CHECK(!tsr_pp_split_counts(&lm, 2, 1, "auto", counts, why, sizeof why) && counts[0] == 5 &&
               counts[1] == 3,
           "auto, 8 layers on pp 2: %d,%d (5,3: the head outweighs a layer)", counts[0],
           counts[1]);
  /* Llama 3 405B's shape: 126 layers on 16 stages, one fewer on the first and the last. */
  tsr_model_config big = {.arch = TSR_ARCH_LLAMA, .n_layer = 126, .d_model = 16384,
                          .n_head = 128, .n_kv_head = 8, .d_ff = 53248,
                          .vocab_size = 128256, .seq_len = 8192};
  int llama3 = !tsr_pp_split_counts(&big, 16, 1, "auto", counts, why, sizeof why) &&
               counts[0] == 7 && counts[15] == 7;
  for (int c = 1; c < 15; c++) llama3 &= counts[c] == 8;
  TU_CHECK(llama3, "auto, 126 layers of Llama 3 405B on pp 16: 7, 14 x 8, 7 (first %d, last %d)",
           counts[0], counts[15]);

  /* zb_v's V: chunk c on stage c up to pp - 1, then back down; the other kinds keep
   * chunk % pp; tsr_pp_stage_chunk inverts the placement, tsr_pp_head_stage finds the
   * last chunk. */
  int v_ok = 1;
  for (int c = 0; c < 8; c++) {
    const int owner = c < 4 ? c : 7 - c;
    if (tsr_pp_chunk_owner(TSR_SCHEDULE_ZB_V, 4, 2, c) != owner) v_ok = 0;
    for (int k = 0; k < TSR_SCHEDULE_ZB_V; k++)
      if (tsr_pp_chunk_owner((tsr_schedule_choice)k, 4, 2, c) != c % 4) v_ok = 0;
    for (int k = 0; k <= TSR_SCHEDULE_ZB_V; k++) {
      const int st = tsr_pp_chunk_owner((tsr_schedule_choice)k, 4, 2, c);
      if (tsr_pp_stage_chunk((tsr_schedule_choice)k, 4, 2, st, c / 4) != c) v_ok = 0;
    }
  }
  v_ok &= tsr_pp_head_stage(TSR_SCHEDULE_ZB_V, 4, 2) == 0 &&
          tsr_pp_head_stage(TSR_SCHEDULE_INTERLEAVED, 4, 2) == 3 &&
          tsr_pp_head_stage(TSR_SCHEDULE_1F1B, 4, 1) == 3 &&
          tsr_pp_stage_chunk(TSR_SCHEDULE_ZB_V, 4, 2, 1, 1) == 6 &&
          tsr_pp_stage_chunk(TSR_SCHEDULE_ZB_V, 4, 2, 4, 0) == -1;
  TU_CHECK(v_ok && tsr_pp_chunk_owner(TSR_SCHEDULE_ZB_V, 4, 2, 8) == -1 &&
               tsr_pp_chunk_owner(TSR_SCHEDULE_1F1B, 0, 1, 0) == -1,
           "chunk owners: zb_v pp=4 puts chunks 0..7 on stages 0 1 2 3 3 2 1 0, the other "
           "kinds on c %% 4; out of range gives -1");

  /* The formula itself, against hand values. */
  TU_CHECK(fabs(tsr_pp_ideal_bubble(K("1f1b"), 4, 8, 1) - 3.0 / 11) < 1e-15 &&
               fabs(tsr_pp_ideal_bubble(K("interleaved"), 4, 8, 2) - 3.0 / 19) < 1e-15 &&
               tsr_pp_ideal_bubble(K("gpipe"), 1, 5, 1) == 0 &&
               tsr_pp_ideal_bubble(K("x"), 4, 8, 1) < 0,
           "ideal bubble: 1f1b pp=4 m=8 %.4f (3/11), interleaved v=2 %.4f (3/19)",
           tsr_pp_ideal_bubble(K("1f1b"), 4, 8, 1), tsr_pp_ideal_bubble(K("interleaved"), 4, 8, 2));
  /* zb_h1 pp=4 m=8: idle 3 of 27 units; m=2: idle 5 of 11.  zb_v pp=4 m=8: idle 3 of
   * 51 chunk units; m=4: max(3, 14 - 8) = 6 of 30. */
  TU_CHECK(fabs(tsr_pp_ideal_bubble(K("zb_h1"), 4, 8, 1) - 3.0 / 27) < 1e-15 &&
               fabs(tsr_pp_ideal_bubble(K("zb_h1"), 4, 2, 1) - 5.0 / 11) < 1e-15 &&
               fabs(tsr_pp_ideal_bubble(K("zb_v"), 4, 8, 2) - 3.0 / 51) < 1e-15 &&
               fabs(tsr_pp_ideal_bubble(K("zb_v"), 4, 4, 2) - 6.0 / 30) < 1e-15 &&
               tsr_pp_ideal_bubble(K("zb_h1"), 1, 3, 1) == 0,
           "ideal bubble: zb_h1 pp=4 m=8 %.4f (3/27, 1f1b 9/33), zb_v pp=4 m=8 %.4f (3/51)",
           tsr_pp_ideal_bubble(K("zb_h1"), 4, 8, 1), tsr_pp_ideal_bubble(K("zb_v"), 4, 8, 2));
  return tu_summary("test_schedule");
}
