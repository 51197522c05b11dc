/* pp_exec.c — the pipeline executor.
 *
 * It walks this stage's action list in order.  A receive is posted (non-blocking) when
 * the schedule says, into the buffer of the micro-batch-chunk's activation slot, and
 * waited for just before the forward or backward that needs it; a send is posted right
 * after the computation that produced it and completed before its buffer is reused.
 * The schedule generator orders every stage's list from one global sequence, so this
 * cannot deadlock (pipeline.c).  A tag names (direction, receiving chunk); the
 * micro-batch needs none: between two stages the messages of one chunk and direction
 * are sent and received in micro-batch order, and MPI does not let messages with equal
 * (source, tag, communicator) overtake each other.  So tags stay below 2 pp v, far from
 * MPI's guaranteed limit of 32767, whatever the number of micro-batches.
 *
 * Slots: a micro-batch-chunk gets a slot at its first action (its receive, or its
 * forward) and gives it back after its backward (and the send of its input gradient).
 * The model keeps that many activation sets; one chunk on the loop order needs
 * min(m, pp - stage) + the
 * receives posted ahead.
 *
 * Chunks c - 1 and c on the same stage (a V's bend): no transfer; the forward of c copies
 * its input from the output of (mb, c - 1)'s slot, and the B pass of c copies its input
 * gradient into (mb, c - 1)'s grad_in, which counts as c's send. */
#include "ops/ops.h"
#include "pp_exec.h"

#include <string.h>

#include "comm/comm.h"
#include "core/util.h"

enum { DIR_ACT = 0, DIR_GRAD = 1 };

typedef struct {
  int mb, chunk; /* owner, or mb = -1 when free */
  int w_pending; /* split backward: B has run, W has not (the activations are still needed) */
  int sent;      /* split backward: its input gradient has been sent (SEND_GRAD before W) */
  void *act_in, *grad_in, *grad_out; /* the model's storage type */
  tsr_comm_handle recv_act, recv_grad, send_act, send_grad;
} pslot;

struct tsr_pp_exec {
  const tsr_grid *grid;
  tsr_model *model;
  tsr_zero *zero;
  tsr_pp_schedule *s;
  int n_slots, m, pp, v, stage;
  size_t act_bytes; /* a chunk's input / output activation, and its gradient */
  pslot *slots;
  int32_t *inputs, *targets;
  void *eval_buf;
  double *eval_loss; /* op memory: the evaluation's loss on the last stage */
};

static int slot_of(tsr_pp_exec *ex, int mb, int chunk) {
  for (int i = 0; i < ex->n_slots; i++)
    if (ex->slots[i].mb == mb && ex->slots[i].chunk == chunk) return i;
  return -1;
}

/* Chunk c - 1 is on this stage too (a V's bend): hand over without a transfer. */
static int same_stage_prev(const tsr_pp_schedule *s, int chunk) {
  return chunk > 0 && tsr_pp_chunk_owner(s->kind, s->pp, s->v, chunk - 1) == s->stage;
}

/* Simulate the slot use of the action list: the number of slots needed.  A slot is taken
 * by its first RECV_ACT or FORWARD and freed once its backward is done (the whole one, or
 * W after B) and, unless it is chunk 0, its input gradient sent. */
int tsr_pp_slots_needed(const tsr_pp_schedule *s) {
  const int total = s->m * s->pp * s->v;
  char *live = tsr_calloc((size_t)total, 1), *done = tsr_calloc((size_t)total, 1);
  char *sent = tsr_calloc((size_t)total, 1);
  if (!live || !done || !sent) {
    tsr_free(&live), tsr_free(&done), tsr_free(&sent);
    return -1;
  }
  int now = 0, peak = 0;
  for (int i = 0; i < s->n; i++) {
    const tsr_pp_action *a = &s->a[i];
    const int key = a->chunk * s->m + a->micro_batch;
    if ((a->op == TSR_PP_RECV_ACT || a->op == TSR_PP_FORWARD) && !live[key]) {
      live[key] = 1;
      peak = ++now > peak ? now : peak;
    }
    if (a->op == TSR_PP_BACKWARD || a->op == TSR_PP_BACKWARD_W) done[key] = 1;
    if (a->op == TSR_PP_SEND_GRAD) sent[key] = 1;
    if ((a->op == TSR_PP_BACKWARD || a->op == TSR_PP_BACKWARD_B) && same_stage_prev(s, a->chunk))
      sent[key] = 1; /* handed over on this stage */
    if (live[key] && done[key] && (sent[key] || a->chunk == 0)) {
      live[key] = 0;
      now--;
    }
  }
  tsr_free(&live);
  tsr_free(&done);
  tsr_free(&sent);
  return peak;
}

int tsr_pp_schedule_for(tsr_pp_schedule **out, const tsr_parallel_config *par, int micro_batches,
                        const tsr_grid *grid) {
  return tsr_pp_schedule_create(out, par->schedule, grid->pp, grid->pp_rank, micro_batches,
                                (int)par->virtual_stages);
}

int tsr_pp_exec_create(tsr_pp_exec **out, const tsr_grid *grid, tsr_model *model, tsr_zero *zero,
                       tsr_pp_schedule *sched) {
  *out = NULL;
  tsr_pp_exec *ex = tsr_calloc(1, sizeof *ex);
  TSR_CHECK(ex, TSR_ERR, "out of memory");
  ex->grid = grid;
  ex->model = model;
  ex->zero = zero;
  ex->s = sched;
  ex->m = sched->m;
  ex->pp = sched->pp;
  ex->v = sched->v;
  ex->stage = sched->stage;
  ex->n_slots = tsr_model_n_slots(model);
  const tsr_model_spec *spec = tsr_model_spec_get(model);
  const size_t N = (size_t)(spec->micro_batch * spec->model.seq_len);
  ex->act_bytes = tsr_model_act_elems(model) * tsr_dtype_size(tsr_model_dtype(model));
  int rc = TSR_ERR;
  ex->slots = tsr_calloc((size_t)ex->n_slots, sizeof *ex->slots);
  ex->inputs = tsr_calloc(N, sizeof(int32_t));
  ex->targets = tsr_calloc(N, sizeof(int32_t));
  ex->eval_buf = tsr_ops_alloc(ex->act_bytes, 1);
  ex->eval_loss = tsr_ops_alloc(1, sizeof(double));
  if (!ex->slots || !ex->inputs || !ex->targets || !ex->eval_buf || !ex->eval_loss) goto fail;
  for (int i = 0; i < ex->n_slots; i++) {
    pslot *p = &ex->slots[i];
    p->mb = -1;
    if (!(p->act_in = tsr_ops_alloc(ex->act_bytes, 1)) ||
        !(p->grad_in = tsr_ops_alloc(ex->act_bytes, 1)) ||
        !(p->grad_out = tsr_ops_alloc(ex->act_bytes, 1)))
      goto fail;
  }
  *out = ex;
  return 0;
fail:
  tsr_pp_exec_destroy(&ex);
  return rc;
}

void tsr_pp_exec_destroy(tsr_pp_exec **exp) {
  if (!exp || !*exp) return;
  tsr_pp_exec *ex = *exp;
  if (ex->slots)
    for (int i = 0; i < ex->n_slots; i++) {
      pslot *p = &ex->slots[i];
      tsr_comm_wait(&p->recv_act);
      tsr_comm_wait(&p->recv_grad);
      tsr_comm_wait(&p->send_act);
      tsr_comm_wait(&p->send_grad);
      tsr_ops_free(&p->act_in);
      tsr_ops_free(&p->grad_in);
      tsr_ops_free(&p->grad_out);
    }
  tsr_free(&ex->slots);
  tsr_free(&ex->inputs);
  tsr_free(&ex->targets);
  tsr_ops_free(&ex->eval_buf);
  tsr_ops_free(&ex->eval_loss);
  tsr_free(exp);
}

/* A free slot for (mb, chunk); its earlier sends complete first (their buffers are the
 * slot's).  Time spent there counts as idle. */
static int take_slot(tsr_pp_exec *ex, int mb, int chunk, double *idle) {
  int i = slot_of(ex, mb, chunk);
  if (i >= 0) return i;
  for (i = 0; i < ex->n_slots; i++)
    if (ex->slots[i].mb < 0) break;
  TSR_CHECK(i < ex->n_slots, -1, "pipeline: no free activation slot for micro-batch %d chunk %d",
            mb, chunk);
  pslot *p = &ex->slots[i];
  const double t0 = tsr_now();
  if (tsr_comm_wait(&p->send_act) || tsr_comm_wait(&p->send_grad)) return -1;
  *idle += tsr_now() - t0;
  p->mb = mb;
  p->chunk = chunk;
  p->w_pending = p->sent = 0;
  return i;
}

/* The input gradient B (or the whole backward) of (mb, chunk) just made: kept for its
 * SEND_GRAD, or given to (mb, chunk - 1) on this stage, which is then this slot's send. */
static int pass_input_grad(tsr_pp_exec *ex, pslot *p, int mb, int chunk) {
  if (chunk == 0) return 0;
  if (!same_stage_prev(ex->s, chunk)) {
    tsr_ops_copy(p->grad_out, tsr_model_input_grad(ex->model), ex->act_bytes);
    return 0;
  }
  const int prev = slot_of(ex, mb, chunk - 1);
  TSR_CHECK(prev >= 0, TSR_ERR, "pipeline: micro-batch %d chunk %d has no slot", mb, chunk - 1);
  tsr_ops_copy(ex->slots[prev].grad_in, tsr_model_input_grad(ex->model), ex->act_bytes);
  p->sent = 1;
  return 0;
}

/* No micro-batch in the tag: MPI's non-overtaking rule orders them (see the header). */
static int tag(const tsr_pp_exec *ex, int dir, int recv_chunk) {
  return dir * ex->pp * ex->v + recv_chunk;
}

static int wait_timed(tsr_comm_handle *h, double *idle) {
  const double t0 = tsr_now();
  const int rc = tsr_comm_wait(h);
  *idle += tsr_now() - t0;
  return rc;
}

int tsr_pp_exec_step(tsr_pp_exec *ex, const tsr_data *data, int64_t first, float dloss,
                     double *loss_acc, tsr_pp_step_stats *stats) {
  memset(stats, 0, sizeof *stats);
  tsr_comm *pp = ex->grid->pp_comm;
  const int last_chunk = ex->pp * ex->v - 1;
  const tsr_model_spec *spec = tsr_model_spec_get(ex->model);
  const int64_t mb_size = spec->micro_batch;
  const size_t bytes = ex->act_bytes;
  const int docs = spec->document_mask;
  const double t_start = tsr_now();
  for (int k = 0; k < ex->s->n; k++) {
    const tsr_pp_action *a = &ex->s->a[k];
    const int local = a->chunk / ex->pp; /* the model's chunk index, for every placement */
    const int si = take_slot(ex, a->micro_batch, a->chunk, &stats->idle_s);
    if (si < 0) return TSR_ERR;
    pslot *p = &ex->slots[si];
    switch (a->op) {
    case TSR_PP_RECV_ACT:
      TSR_CALL(tsr_comm_irecv(pp, p->act_in, bytes, a->peer,
                              tag(ex, DIR_ACT, a->chunk), &p->recv_act));
      break;
    case TSR_PP_RECV_GRAD:
      TSR_CALL(tsr_comm_irecv(pp, p->grad_in, bytes, a->peer,
                              tag(ex, DIR_GRAD, a->chunk), &p->recv_grad));
      break;
    case TSR_PP_FORWARD: {
      TSR_CALL(wait_timed(&p->recv_act, &stats->idle_s));
      const int embeds = a->chunk == 0, heads = a->chunk == last_chunk;
      if (same_stage_prev(ex->s, a->chunk)) {
        const int prev = slot_of(ex, a->micro_batch, a->chunk - 1);
        TSR_CHECK(prev >= 0, TSR_ERR, "pipeline: micro-batch %d chunk %d has no output",
                  a->micro_batch, a->chunk - 1);
        tsr_ops_copy(p->act_in, tsr_model_chunk_output(ex->model, prev), bytes);
      }
      /* every stage reads the micro-batch's tokens it needs from the shards itself: the
       * first its inputs, the last its targets, and with document masking every stage
       * the inputs, which its document boundaries come from */
      if (embeds || heads || docs)
        tsr_data_batch(data, first + a->micro_batch * mb_size, mb_size, ex->inputs, ex->targets);
      TSR_CALL(tsr_model_chunk_forward(ex->model, local, si, embeds || docs ? ex->inputs : NULL,
                                       heads ? ex->targets : NULL, embeds ? NULL : p->act_in,
                                       dloss, 1, heads ? loss_acc : NULL));
      break;
    }
    case TSR_PP_SEND_ACT:
      TSR_CALL(tsr_comm_isend(pp, tsr_model_chunk_output(ex->model, si), bytes, a->peer,
                              tag(ex, DIR_ACT, a->chunk + 1), &p->send_act));
      break;
    case TSR_PP_BACKWARD:
      TSR_CALL(wait_timed(&p->recv_grad, &stats->idle_s));
      /* ZeRO 0-1 reduce a unit's gradient after its last micro-batch's backward */
      TSR_CALL(tsr_zero_begin_micro(ex->zero, a->micro_batch == ex->m - 1));
      TSR_CALL(tsr_model_chunk_backward(ex->model, local, si,
                                        a->chunk == last_chunk ? NULL : p->grad_in));
      TSR_CALL(pass_input_grad(ex, p, a->micro_batch, a->chunk));
      if (a->chunk == 0 || p->sent) p->mb = -1; /* nothing to send: the slot is free */
      break;
    case TSR_PP_SEND_GRAD:
      TSR_CALL(tsr_comm_isend(pp, p->grad_out, bytes, a->peer,
                              tag(ex, DIR_GRAD, a->chunk - 1), &p->send_grad));
      if (p->w_pending)
        p->sent = 1; /* W still needs the slot's activations */
      else
        p->mb = -1; /* free once the send completes (take_slot waits for it) */
      break;
    case TSR_PP_BACKWARD_B: /* the zero-bubble kinds: input gradients now, W later */
      TSR_CALL(wait_timed(&p->recv_grad, &stats->idle_s));
      TSR_CALL(tsr_model_chunk_backward_input(ex->model, local, si,
                                              a->chunk == last_chunk ? NULL : p->grad_in));
      p->w_pending = 1;
      TSR_CALL(pass_input_grad(ex, p, a->micro_batch, a->chunk));
      break;
    case TSR_PP_BACKWARD_W:
      /* ZeRO reduces a unit's gradient after its last micro-batch's W */
      TSR_CALL(tsr_zero_begin_micro(ex->zero, a->micro_batch == ex->m - 1));
      TSR_CALL(tsr_model_chunk_backward_weight(ex->model, local, si));
      p->w_pending = 0;
      if (a->chunk == 0 || p->sent) p->mb = -1;
      break;
    }
  }
  for (int i = 0; i < ex->n_slots; i++) { /* the step ends with nothing in flight */
    TSR_CALL(wait_timed(&ex->slots[i].send_act, &stats->idle_s));
    TSR_CALL(wait_timed(&ex->slots[i].send_grad, &stats->idle_s));
  }
  stats->total_s = tsr_now() - t_start;
  return 0;
}

int tsr_pp_exec_eval(tsr_pp_exec *ex, const int32_t *inputs, const int32_t *targets,
                     double *loss) {
  tsr_comm *pp = ex->grid->pp_comm;
  const int n_chunks = ex->pp * ex->v;
  const size_t bytes = ex->act_bytes;
  tsr_ops_zero(ex->eval_loss, sizeof(double));
  /* slot 0 is free between steps; chunks run one after another, stage to stage */
  const tsr_schedule_choice kind = ex->s->kind;
  for (int c = 0; c < n_chunks; c++) {
    const int owner = tsr_pp_chunk_owner(kind, ex->pp, ex->v, c);
    const int prev = c > 0 ? tsr_pp_chunk_owner(kind, ex->pp, ex->v, c - 1) : owner;
    if (owner != ex->stage) continue;
    if (c > 0 && prev != ex->stage) TSR_CALL(tsr_comm_recv(pp, ex->eval_buf, bytes, prev, c));
    else if (c > 0) tsr_ops_copy(ex->eval_buf, tsr_model_chunk_output(ex->model, 0), bytes);
    TSR_CALL(tsr_model_chunk_forward(ex->model, c / ex->pp, 0,
                                     c == 0 || tsr_model_spec_get(ex->model)->document_mask ? inputs : NULL,
                                     c == n_chunks - 1 ? targets : NULL,
                                     c == 0 ? NULL : ex->eval_buf, 0.0f, 0,
                                     c == n_chunks - 1 ? ex->eval_loss : NULL));
    const int next = c + 1 < n_chunks ? tsr_pp_chunk_owner(kind, ex->pp, ex->v, c + 1) : owner;
    if (c + 1 < n_chunks && next != ex->stage)
      TSR_CALL(tsr_comm_send(pp, tsr_model_chunk_output(ex->model, 0), bytes, next, c + 1));
  }
  double my_loss = 0.0;
  if (ex->stage == tsr_pp_head_stage(kind, ex->pp, ex->v))
    tsr_ops_read(&my_loss, ex->eval_loss, sizeof my_loss);
  else
    tsr_ops_sync();
  return tsr_comm_sum_ordered(pp, my_loss, loss);
}
