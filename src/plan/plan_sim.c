/* plan_sim.c — the planner's step by replaying the schedule (plan_sim.h): every stage's
 * action list as pipeline.c generates it and pp_exec.c runs it, with the chunk costs of
 * plan_cost.c, the transfers on their links, the reductions overlapped with the backward
 * they follow, then the optimizer.  docs/architecture.md "The planner's time model".
 *
 * Many micro-batches.  The generator's lists and the replay cost about pp^2 m v, and the
 * search prices thousands of layouts, some with hundreds of thousands of micro-batches.
 * A schedule's steady state repeats (every micro-batch, or every pp of them with several chunks), so
 * beyond a window (tsr_plan_sim_window: m1 = 2 w + m mod u, u = pp v, w = u max(4,
 * ceil(256 / u))) the replay runs with m0 = m1 - w and m1 micro-batches, both congruent
 * to m modulo u, and every output grows linearly from m1 to m by its increment per
 * micro-batch between the two; up to m1 it is the full replay, bit for bit.
 * tests/unit/plan/test_plan_sim.c finds the extrapolation within 1e-9 of the full replay at m 4096
 * (in practice the last bits of the full replay's own sums). */
#include "plan_sim.h"

#include <math.h>
#include <string.h>

#include "sched/pipeline.h"
#include "core/util.h"

/* ---------------------------------------------------------------- the replay */

typedef struct {
  const tsr_plan_sim_in *in;
  int C;               /* chunks: pp v */
  double *dp_free;     /* [pp] when each stage's reduction link is free */
  double *last_start;  /* [pp] start of the stage's previous computation (ZeRO-3 prefetch) */
} replay;

/* Chunk c's reduction in its pieces, released evenly over [t0, t1] (zero.c reduces a
 * unit when backward is done with it), queued on stage s's link. */
static void reduce(replay *r, int s, int c, double t0, double t1) {
  const tsr_plan_sim_in *in = r->in;
  if (!in->reduce || in->reduce[c] <= 0) return;
  const int k = in->pieces && in->pieces[c] > 0 ? in->pieces[c] : 1;
  for (int j = 0; j < k; j++) {
    const double ready = t0 + (t1 - t0) * (j + 1) / k;
    r->dp_free[s] = fmax(r->dp_free[s], ready) + in->reduce[c] / k;
  }
}

/* A computation of duration dur on stage s whose input is there at `ready` and which
 * follows the stage's clock; with ZeRO-3 it first gathers chunk c's parameters. */
static double compute(replay *r, int s, int c, double *clock, double ready, double dur,
                      double *busy) {
  double start = fmax(*clock, ready), end;
  const tsr_plan_sim_in *in = r->in;
  if (in->gather && in->gather[c] > 0) {
    const int k = in->pieces && in->pieces[c] > 0 ? in->pieces[c] : 1;
    const double g0 = fmax(r->dp_free[s], r->last_start[s]);
    r->dp_free[s] = g0 + in->gather[c];
    start = fmax(start, g0 + in->gather[c] / k);
    end = fmax(start + dur, r->dp_free[s] + dur / k);
  } else {
    end = start + dur;
  }
  r->last_start[s] = start;
  *busy += dur;
  *clock = end;
  return start;
}

/* pp = 1: micro-batch after micro-batch, as the trainer accumulates gradients. */
static void replay_one(replay *r, tsr_plan_sim_out *out) {
  const tsr_plan_sim_in *in = r->in;
  double clock = 0, busy = 0;
  for (int mb = 0; mb < in->m; mb++) {
    compute(r, 0, 0, &clock, 0, in->f[0], &busy);
    const double t0 = compute(r, 0, 0, &clock, 0, in->b[0] + (in->w ? in->w[0] : 0), &busy);
    if (in->reduce_every || mb == in->m - 1) reduce(r, 0, 0, t0, clock);
  }
  out->end[0] = clock;
  out->busy[0] = busy;
  out->reduced[0] = fmax(clock, r->dp_free[0]);
}

/* The message queues: one per (sending stage, direction). */
static double *queue(double *q, int pp, int from, int to) {
  return &q[2 * from + (to == (from + 1) % pp ? 0 : 1)];
}
static int owner(const tsr_plan_sim_in *in, int c) {
  return tsr_pp_chunk_owner(in->kind, in->pp, in->v, c);
}
static double link_s(const tsr_plan_sim_in *in, int a, int b) {
  if (!in->p2p) return 0;
  return in->p2p[b == (a + 1) % in->pp ? a : b];
}

int tsr_plan_simulate_full(const tsr_plan_sim_in *in, tsr_plan_sim_out *out) {
  const int pp = in->pp, m = in->m, C = pp * in->v;
  replay r = {in, C, tsr_calloc((size_t)pp, sizeof(double)),
              tsr_calloc((size_t)pp, sizeof(double))};
  if (!r.dp_free || !r.last_start) {
    tsr_free(&r.dp_free), tsr_free(&r.last_start);
    return TSR_ERR;
  }
  if (pp == 1) {
    replay_one(&r, out);
    tsr_free(&r.dp_free), tsr_free(&r.last_start);
    return 0;
  }
  int rc = 0;
  const size_t pairs = (size_t)m * (size_t)C;
  tsr_pp_schedule **S = tsr_calloc((size_t)pp, sizeof *S);
  int *pos = tsr_calloc((size_t)pp, sizeof *pos);
  double *clock = tsr_calloc((size_t)pp, sizeof *clock), *q = tsr_calloc(2 * (size_t)pp, sizeof *q);
  /* per (micro-batch, chunk): arrival of its input activation / output gradient; the end
   * of its F and B (B before W when split), and B's start */
  double *act = tsr_calloc(pairs, sizeof *act), *grad = tsr_calloc(pairs, sizeof *grad);
  double *f_end = tsr_calloc(pairs, sizeof *f_end), *b_end = tsr_calloc(pairs, sizeof *b_end);
  double *b_start = tsr_calloc(pairs, sizeof *b_start);
  if (!S || !pos || !clock || !q || !act || !grad || !f_end || !b_end || !b_start) {
    rc = TSR_ERR;
    goto done;
  }
  for (int s = 0; s < pp && !rc; s++)
    rc = tsr_pp_schedule_create(&S[s], in->kind, pp, s, m, in->v);
  if (rc) goto done;
  for (size_t i = 0; i < pairs; i++) act[i] = grad[i] = f_end[i] = b_end[i] = -1;
  for (int s = 0; s < pp; s++) out->busy[s] = 0;
  for (int left = 1, progress = 1; left && progress;) {
    left = progress = 0;
    for (int s = 0; s < pp; s++) {
      for (; pos[s] < S[s]->n; pos[s]++, progress = 1) {
        const tsr_pp_action *a = &S[s]->a[pos[s]];
        const int c = a->chunk;
        const size_t i = (size_t)a->micro_batch * (size_t)C + (size_t)c;
        double ready = 0, *when;
        switch (a->op) {
        case TSR_PP_RECV_ACT:
        case TSR_PP_RECV_GRAD:
          continue; /* posted early: costs nothing */
        case TSR_PP_FORWARD: /* the previous chunk's output: a message, or this stage's */
          ready = c == 0 ? 0 : owner(in, c - 1) == s ? f_end[i - 1] : act[i];
          if (ready < 0) break;
          compute(&r, s, c, &clock[s], ready, in->f[c], &out->busy[s]);
          f_end[i] = clock[s];
          continue;
        case TSR_PP_SEND_ACT:
        case TSR_PP_SEND_GRAD: {
          const int to = a->peer;
          double *qf = queue(q, pp, s, to);
          *qf = fmax(*qf, clock[s]) + link_s(in, s, to);
          when = a->op == TSR_PP_SEND_ACT ? &act[i + 1] : &grad[i - 1];
          *when = *qf;
          continue;
        }
        case TSR_PP_BACKWARD:
        case TSR_PP_BACKWARD_B: {
          ready = c == C - 1 ? f_end[i] : owner(in, c + 1) == s ? b_end[i + 1] : grad[i];
          if (ready < 0) break;
          const int fused = a->op == TSR_PP_BACKWARD;
          const double dur = in->b[c] + (fused && in->w ? in->w[c] : 0);
          b_start[i] = compute(&r, s, c, &clock[s], ready, dur, &out->busy[s]);
          b_end[i] = clock[s];
          if (fused && (in->reduce_every || a->micro_batch == m - 1))
            reduce(&r, s, c, b_start[i], clock[s]);
          continue;
        }
        case TSR_PP_BACKWARD_W: {
          const double t0 = compute(&r, s, c, &clock[s], b_end[i], in->w ? in->w[c] : 0,
                                    &out->busy[s]);
          if (in->reduce_every || a->micro_batch == m - 1) reduce(&r, s, c, t0, clock[s]);
          continue;
        }
        }
        break; /* an input not there yet: another stage must move first */
      }
      left |= pos[s] < S[s]->n;
    }
  }
  for (int s = 0; s < pp && !rc; s++) {
    if (pos[s] < S[s]->n) { /* the lists are deadlock-free (pipeline.c): a bug here */
      tsr_error("plan: the replay stalled on stage %d at %s (pp %d, m %d, v %d)", s,
                tsr_pp_op_name(S[s]->a[pos[s]].op), pp, m, in->v);
      rc = TSR_ERR;
      break;
    }
    out->end[s] = clock[s];
    out->reduced[s] = fmax(clock[s], r.dp_free[s]);
  }
done:
  for (int s = 0; S && s < pp; s++) tsr_pp_schedule_destroy(&S[s]);
  tsr_free(&S), tsr_free(&pos), tsr_free(&clock), tsr_free(&q), tsr_free(&act);
  tsr_free(&grad), tsr_free(&f_end), tsr_free(&b_end), tsr_free(&b_start);
  tsr_free(&r.dp_free), tsr_free(&r.last_start);
  return rc;
}

/* ---------------------------------------------------------------- many micro-batches */

int tsr_plan_sim_window(int pp, int v, int m, int *m0, int *m1) {
  const int u = pp * v, units = (TSR_PLAN_SIM_WINDOW + u - 1) / u, w = u * (units > 4 ? units : 4);
  *m0 = w + m % u;
  *m1 = *m0 + w;
  return m > *m1;
}

int tsr_plan_simulate(const tsr_plan_sim_in *in, tsr_plan_sim_out *out) {
  int m0, m1;
  if (!tsr_plan_sim_window(in->pp, in->v, in->m, &m0, &m1)) return tsr_plan_simulate_full(in, out);
  const int pp = in->pp;
  double *x = tsr_calloc(3 * (size_t)pp, sizeof *x);
  TSR_CHECK(x, TSR_ERR, "out of memory");
  /* the replay with m0 micro-batches into x; with m1 into out */
  tsr_plan_sim_in at = *in;
  tsr_plan_sim_out o0 = {x, x + pp, x + 2 * pp};
  at.m = m0;
  int rc = tsr_plan_simulate_full(&at, &o0);
  at.m = m1;
  if (!rc) rc = tsr_plan_simulate_full(&at, out);
  /* each figure grows by its increment per micro-batch between the two, for the m - m1
   * micro-batches left; a stage never computes longer than its window, nor reduces
   * before its window ends */
  const double more = (double)(in->m - m1), w = (double)(m1 - m0);
  for (int s = 0; s < pp && !rc; s++) {
    const double d_end = (out->end[s] - o0.end[s]) / w, d_busy = (out->busy[s] - o0.busy[s]) / w;
    const double d_red = (out->reduced[s] - o0.reduced[s]) / w;
    out->busy[s] += d_busy * more;
    out->end[s] = fmax(out->end[s] + d_end * more, out->busy[s]);
    out->reduced[s] = fmax(out->reduced[s] + d_red * more, out->end[s]);
  }
  tsr_free(&x);
  return rc;
}

/* ---------------------------------------------------------------- the step */

/* Whether a group of `size` ranks spanning `span` ranks (ranks: tp fastest, then cp, dp,
 * pp) crosses nodes of rpn ranks, as plan.c names its groups. */
static int group_link(int size, long span, int rpn) { return tsr_plan_group_link(size, span, rpn); }
/* The link between the first ranks of stages a and b. */
static int stage_link(const tsr_plan_grid *g, int a, int b) {
  const long stride = (long)g->dpcp * g->tp;
  return a * stride / g->ranks_per_node == b * stride / g->ranks_per_node ? TSR_LINK_INTRA
                                                                          : TSR_LINK_INTER;
}

typedef struct {
  double *f, *b, *w, *reduce, *gather, *p2p, *end, *busy, *reduced, *elems, *first, *back;
  int *pieces, *units;
} step_arrays;

static void free_arrays(step_arrays *a) {
  double **d[] = {&a->f,    &a->b,    &a->w,       &a->reduce, &a->gather, &a->p2p,
                  &a->end,  &a->busy, &a->reduced, &a->elems,  &a->first, &a->back};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) tsr_free(d[i]);
  tsr_free(&a->pieces), tsr_free(&a->units);
}

static int alloc_arrays(step_arrays *a, int C, int pp) {
  memset(a, 0, sizeof *a);
  double **byc[] = {&a->f, &a->b, &a->w, &a->reduce, &a->gather};
  double **bys[] = {&a->p2p, &a->end, &a->busy, &a->reduced, &a->elems, &a->first, &a->back};
  int ok = (a->pieces = tsr_calloc((size_t)C, sizeof(int))) != NULL;
  ok &= (a->units = tsr_calloc((size_t)pp, sizeof(int))) != NULL;
  for (int i = 0; i < 5; i++) ok &= (*byc[i] = tsr_calloc((size_t)C, sizeof(double))) != NULL;
  for (int i = 0; i < 7; i++) ok &= (*bys[i] = tsr_calloc((size_t)pp, sizeof(double))) != NULL;
  if (!ok) free_arrays(a);
  TSR_CHECK(ok, TSR_ERR, "out of memory");
  return 0;
}

/* Chunk costs into the replay's inputs; the critical stage's per-micro-batch times. */
static int chunk_inputs(tsr_plan *p, const tsr_config *cfg, step_arrays *a) {
  const tsr_plan_grid *g = &p->grid;
  const tsr_hardware *hw = &p->hw;
  const int zs = (int)cfg->parallel.zero_stage, S = zs == 0 ? g->dpcp : g->shard;
  const int link = group_link(S, (long)S * g->tp, g->ranks_per_node);
  const double e = cfg->train.precision != TSR_F32 ? 2 : 4;
  for (int c = 0; c < g->pp * g->v; c++) {
    tsr_plan_chunk ch;
    TSR_CALL(tsr_plan_chunk_cost(cfg, hw, g, c, &ch));
    a->f[c] = ch.f, a->b[c] = ch.b, a->w[c] = ch.w, a->pieces[c] = ch.units;
    const double grad = 4 * ch.elems; /* fp32 gradients */
    a->reduce[c] = zs == 0 ? tsr_plan_all_reduce_s(hw, link, g->dpcp, grad)
                           : tsr_plan_gather_s(hw, link, S, grad); /* a reduce-scatter */
    a->gather[c] = zs == 3 ? tsr_plan_gather_s(hw, link, S, e * ch.elems) : 0;
    const int s = tsr_pp_chunk_owner(cfg->parallel.schedule, g->pp, g->v, c);
    a->elems[s] += ch.elems;
    a->units[s] += ch.units;
    a->first[s] += ch.f; /* one micro-batch's forward through the stage's chunks */
    a->back[s] += ch.b + ch.w; /* and its backward */
    if (s == p->sim.critical) {
      p->sim.f += ch.f, p->sim.b += ch.b, p->sim.w += ch.w;
      p->sim.gemm += ch.gemm, p->sim.attention += ch.attention, p->sim.memory += ch.memory;
      p->sim.tp += ch.f_tp + ch.b_tp + ch.w_tp;
      p->sim.cp += ch.f_cp + ch.b_cp;
    }
  }
  /* one activation (or its gradient) between neighbouring stages: the residual stream's
   * [micro_batch x seq_len / cp, d_model] slice (sequence parallel: a tp rank's share) */
  const int sp = cfg->parallel.sequence_parallel && g->tp > 1;
  const double msg = (double)cfg->train.micro_batch * (double)cfg->model.seq_len / g->cp /
                     (sp ? g->tp : 1) * (double)cfg->model.d_model * e;
  for (int s = 0; s < g->pp && g->pp > 1; s++)
    a->p2p[s] = tsr_plan_link_s(hw, stage_link(g, s, (s + 1) % g->pp), msg, 1);
  return 0;
}

/* What follows the last reduction on stage s: the gradient norm's pass over the shard,
 * AdamW over it (master, m, v and the gradient in and out, the compute copy out: 28 + 2
 * or 4 bytes per element, as plan.c counts it), the next step's clearing of the gradient
 * buffer (zero.c: the whole flat buffer at stages 0-1, the shard at 2-3), then ZeRO 1-2's
 * gather of the updated parameters, less what the profile's gather_overlap hides behind
 * the next step's first forward (Tessera: none; Megatron-LM's --overlap-param-gather
 * waits for each bucket where that forward first needs it), and the hybrid copies'
 * all-reduce (with the gradient on the host, its offloaded part then runs over host
 * memory: tsr_plan_replica_all_reduce_s).
 * With parallel.offload the offloaded part's update (tsr_plan_offload_of, placed by
 * tsr_plan_offload_place with the stage's `units` and `first_forward`: *offload) runs
 * beside the device's AdamW over the rest: the stage pays the longer of the two (after the
 * last unit's copy to the host, which the device's AdamW waits for too: the gradient norm
 * needs it).  *hidden: what hiding the offloaded update behind the last micro-batch's
 * backward (`backward`) as well would take off, down to the device's AdamW (not
 * implemented: the update waits for the gradient norm, which clipping and the fp16 skip
 * need). */
static double stage_tail(const tsr_plan *p, const tsr_config *cfg, double elems, int units,
                         double first_forward, double backward, tsr_plan_offload *offload,
                         double *hidden) {
  const tsr_plan_grid *g = &p->grid;
  const tsr_hardware *hw = &p->hw;
  const int zs = (int)cfg->parallel.zero_stage, S = zs == 0 ? 1 : g->shard;
  const double e = cfg->train.precision != TSR_F32 ? 2 : 4, own = elems / S;
  const int link = group_link(g->shard, (long)g->shard * g->tp, g->ranks_per_node);
  const int rpn = g->ranks_per_node;
  tsr_plan_offload o = tsr_plan_offload_of(cfg, hw, own);
  tsr_plan_offload_place(&o, zs, units, first_forward, first_forward + backward,
                         p->grid.micro_batches);
  *offload = o;
  double unhidden;
  const double update = tsr_plan_update_s(hw, &o, own, e, &unhidden);
  *hidden = update - fmax(unhidden, update - backward);
  /* the host's gradient work (host_grads): the norm's pass, and what the micro-batches do
   * not hide of its additions; neither can move behind the backward */
  double t = tsr_plan_stream_s(hw, own * 4) + update + o.host_norm_s + o.accum_exposed_s +
             tsr_plan_stream_s(hw, 4 * (zs < 2 ? elems : own));
  if (zs == 1 || zs == 2) /* behind the next step's first forward, as far as it overlaps */
    t += fmax(0, tsr_plan_gather_s(hw, link, S, e * elems) -
                     hw->prof.gather_overlap * first_forward);
  if (zs > 0 && g->replicate > 1)
    t += tsr_plan_replica_all_reduce_s(hw, group_link(g->dpcp, (long)g->dpcp * g->tp, rpn),
                                       g->replicate, own, &o);
  return t;
}

int tsr_plan_sim_step(tsr_plan *p, const tsr_config *cfg) {
  const tsr_plan_grid *g = &p->grid;
  const tsr_hardware *hw = &p->hw;
  const int pp = g->pp, C = pp * g->v;
  step_arrays a;
  TSR_CALL(alloc_arrays(&a, C, pp));
  p->sim.closed_pipeline = p->t_pipeline;
  p->sim.closed_step = p->t_step;
  p->sim.critical = p->critical;
  int rc = chunk_inputs(p, cfg, &a);
  const tsr_plan_sim_in in = {cfg->parallel.schedule, pp, g->micro_batches, g->v, a.f, a.b,
                              a.w, a.p2p, a.reduce, a.pieces,
                              cfg->parallel.zero_stage >= 2, a.gather};
  tsr_plan_sim_out out = {a.end, a.busy, a.reduced};
  if (!rc) rc = tsr_plan_simulate(&in, &out);
  if (rc) {
    free_arrays(&a);
    return rc;
  }
  double grads = 0, tail = 0, busy = 0, idle = 0, tail_ov = 0, off = 0;
  p->sim.pipeline = p->sim.idle_max = 0;
  for (int s = 0; s < pp; s++) {
    tsr_plan_stage *st = &p->stages[s];
    st->sim_end = a.end[s], st->sim_busy = a.busy[s];
    st->sim_idle = a.end[s] > 0 ? 1 - a.busy[s] / a.end[s] : 0;
    p->sim.pipeline = fmax(p->sim.pipeline, a.end[s]);
    grads = fmax(grads, a.reduced[s]);
    tsr_plan_offload o;
    double hidden;
    const double t = stage_tail(p, cfg, a.elems[s], a.units[s], a.first[s], a.back[s], &o,
                                &hidden);
    tail = fmax(tail, t);
    tail_ov = fmax(tail_ov, t - hidden);
    off = fmax(off, o.tail_s);
    if (st->done) /* the stage's own update (its padded shard, plan.c) placed the same way */
      tsr_plan_offload_place(&st->offload, (int)cfg->parallel.zero_stage, a.units[s], a.first[s],
                             a.first[s] + a.back[s], g->micro_batches);
    busy += a.busy[s] / pp;
    idle += st->sim_idle / pp;
    p->sim.idle_max = fmax(p->sim.idle_max, st->sim_idle);
  }
  p->sim.reduced = grads;
  p->sim.idle_mean = idle;
  p->sim.bubble = p->sim.pipeline > 0 ? 1 - busy / p->sim.pipeline : 0;
  /* the tied embedding's gradient summed between the first and the last stage, the
   * gradient norm over all ranks (a scalar), then each stage's update */
  const double tied = cfg->model.tie_embeddings && pp > 1
                         ? tsr_plan_all_reduce_s(hw, stage_link(g, 0, pp - 1), 2,
                                                 4.0 * (double)cfg->model.vocab_size / g->tp *
                                                     (double)cfg->model.d_model)
                         : 0;
  const double norm = tsr_plan_all_reduce_s(hw, g->world > g->ranks_per_node, g->world, 8);
  if (cfg->model.tie_embeddings && pp > 1) tail += tied, tail_ov += tied;
  tail += norm;
  tail_ov += norm;
  p->sim.tail = tail;
  p->sim.offload = off;
  p->t_pipeline = p->sim.pipeline;
  p->t_step = grads + tail;
  p->sim.offload_overlapped = grads + tail_ov;
  const double tokens = (double)cfg->train.global_batch * (double)cfg->model.seq_len;
  const double peak = (cfg->train.precision != TSR_F32 ? hw->peak_tflops : hw->peak_fp32_tflops);
  p->tokens_per_s = tokens / p->t_step;
  p->mfu = p->model_flops / (p->t_step * g->world * peak * 1e12);
  p->sim.tflops_per_gpu = p->model_flops / p->t_step / g->world / 1e12;
  free_arrays(&a);
  return 0;
}
