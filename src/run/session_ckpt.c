/* session_ckpt.c — a session's checkpoints (session.h): what this rank holds (its view),
 * the host copy of a device's state for checkpoint I/O, and the writes, when and how the
 * checkpoint policy says (ckpt_policy.h). */
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_policy.h"
#include "comm/grid.h"
#include "ops/ops.h"
#include "ops/ops_backend.h"
#include "core/runctl.h"
#include "session.h"
#include "core/util.h"
#include "core/watchdog.h"
#include "data/data.h"
#include "parallel/zero.h"

/* Its (stage, tp) part, its ZeRO shard of that, and which of the identical copies of the
 * shard it is (dp replicas at zero 0, hybrid replicas otherwise), so each piece is written
 * once. */
tsr_ckpt_view tsr_session_ckpt_view(const tsr_session *s) {
  tsr_ckpt_view v = {s->lay, tsr_zero_shard_begin(s->zero), tsr_zero_shard_end(s->zero), 0, 1};
  if (s->cfg->parallel.zero_stage == 0)
    v.copy_index = s->grid->dpcp_rank, v.n_copies = s->grid->dpcp;
  else
    v.copy_index = s->grid->replicate_rank, v.n_copies = s->grid->replicate_size;
  return v;
}

/* The state's host copy for checkpoint I/O (session.h): the arrays themselves on the CPU,
 * a page-locked copy of a device's (its op memory part and its offloaded part,
 * parallel.offload, in one piece: the same as without offload). */
int tsr_session_state_host(tsr_session *s, float *hb[3]) {
  const tsr_zero_state st = tsr_zero_state_of(s->zero);
  if (!s->dev) {
    memcpy(hb, st.dev, sizeof st.dev);
    tsr_ops_sync();
    return 0;
  }
  const size_t n = (size_t)st.len;
  float *h = tsr_ops_host_alloc(3 * (n ? n : 1) * sizeof(float));
  if (!h) tsr_error("checkpoint: no host memory for a copy of %zu parameters' state", n);
  for (int k = 0; h && k < 3; k++) {
    hb[k] = h + (size_t)k * n;
    tsr_zero_state_read(&st, k, hb[k]);
  }
  tsr_ops_sync();
  /* the checkpoint's I/O is collective: a copy that failed on one rank (no host memory, a
   * failed device copy) stops every rank here, before a file is written from it */
  const int rc = tsr_run_agree(s->world, !h ? TSR_ERR : tsr_ops_status());
  if (rc) {
    if (h) tsr_session_state_release(s, hb, 0);
    hb[0] = hb[1] = hb[2] = NULL;
  }
  return rc;
}

void tsr_session_state_release(tsr_session *s, float *hb[3], int put) {
  if (!s->dev) return;
  const tsr_zero_state st = tsr_zero_state_of(s->zero);
  for (int k = 0; put && k < 3; k++) tsr_zero_state_write(&st, k, hb[k]);
  tsr_ops_sync();
  void *h = hb[0]; /* the copy's start */
  tsr_ops_host_free(&h);
  hb[0] = hb[1] = hb[2] = NULL;
}

int tsr_session_ckpt_open(tsr_session *s) {
  const tsr_ckpt_view view = tsr_session_ckpt_view(s);
  return tsr_ckpt_policy_open(&s->ckpt, s->cfg, &view, s->st.step, s->metrics, s->world);
}

int tsr_session_ckpt_due(tsr_session *s, double step_s) {
  return s->ckpt && tsr_ckpt_policy_due(s->ckpt, s->st.step, step_s);
}

int tsr_session_ckpt_poll(tsr_session *s) { return tsr_ckpt_policy_poll(s->ckpt); }

int tsr_session_ckpt_wait(tsr_session *s) {
  if (!s->ckpt || !tsr_ckpt_policy_background(s->ckpt)) return 0;
  tsr_watchdog_activity(s->st.step, "waiting for a checkpoint write");
  return tsr_ckpt_policy_wait(s->ckpt);
}

void tsr_session_ckpt_close(tsr_session *s) {
  tsr_session_ckpt_wait(s);
  tsr_ckpt_policy_close(&s->ckpt);
}

int tsr_session_save(tsr_session *s, const char *deck_text, int wait) {
  if (!s->ckpt) TSR_CALL(tsr_session_ckpt_open(s)); /* a save before the loop's set-up */
  if (s->train_data) /* a mixture's blend state at the cursor ("" for one dataset) */
    tsr_data_mix_state(s->train_data, s->st.data_cursor, s->st.data_mix, sizeof s->st.data_mix);
  const int background = tsr_ckpt_policy_background(s->ckpt);
  if (tsr_ckpt_policy_claim(s->ckpt, s->st.step)) { /* a stop right after a periodic one */
    tsr_log("checkpoint: step %lld is written already%s", (long long)s->st.step,
            wait && background ? " (or being written: waiting for it)" : "");
    return wait ? tsr_session_ckpt_wait(s) : 0;
  }
  const double t0 = tsr_now();
  tsr_watchdog_activity(s->st.step, "a checkpoint write");
  if (!background) { /* from the state itself, or from a host copy of a device's */
    const tsr_ckpt_view view = tsr_session_ckpt_view(s);
    float *hb[3];
    TSR_CALL(tsr_session_state_host(s, hb));
    const int rc = tsr_ckpt_save_view(s->cfg, &view, hb[0], hb[1], hb[2], &s->st, deck_text,
                                      s->world);
    tsr_session_state_release(s, hb, 0);
    TSR_CALL(rc);
    tsr_ckpt_policy_wrote(s->ckpt, s->st.step, tsr_now() - t0);
    return 0;
  }
  const tsr_zero_state st = tsr_zero_state_of(s->zero);
  TSR_CALL(tsr_ckpt_policy_start(s->ckpt, st.dev, st.host, st.split, &s->st, deck_text));
  return wait ? tsr_session_ckpt_wait(s) : 0;
}
