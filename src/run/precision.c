/* precision.c — fp16's dynamic loss scale (precision.h). */
#include "precision.h"

#include <math.h>

#include "core/util.h"

static int scaled(const tsr_train_config *tc) { return tc->precision == TSR_F16; }

void tsr_loss_scale_start(const tsr_train_config *tc, tsr_train_state *st) {
  st->loss_scale = scaled(tc) ? tc->loss_scale : 1.0;
  st->scale_good_steps = scaled(tc) ? 0 : -1;
}

void tsr_loss_scale_resumed(const tsr_train_config *tc, tsr_train_state *st) {
  if (!scaled(tc)) {
    st->loss_scale = 1.0;
    st->scale_good_steps = -1;
  } else if (st->scale_good_steps < 0) {
    tsr_loss_scale_start(tc, st);
    tsr_log("the checkpoint is not from an fp16 run: the loss scale starts at %g",
            st->loss_scale);
  } else {
    tsr_log("fp16 loss scale %g (%lld steps since it last changed)", st->loss_scale,
            (long long)st->scale_good_steps);
  }
}

double tsr_loss_scale(const tsr_train_config *tc, const tsr_train_state *st) {
  return scaled(tc) ? st->loss_scale : 1.0;
}

void tsr_loss_scale_update(const tsr_train_config *tc, tsr_train_state *st, int overflowed) {
  if (!scaled(tc)) return;
  if (overflowed) {
    st->loss_scale = fmax(st->loss_scale / 2, tc->min_loss_scale);
    st->scale_good_steps = 0;
  } else if (++st->scale_good_steps >= tc->loss_scale_window) {
    st->loss_scale *= 2;
    st->scale_good_steps = 0;
  }
}
