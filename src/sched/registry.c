/* registry.c — the schedules, in registry.h's order. */
#include "registry.h"

#include <stdio.h>
#include <string.h>

#include "schedule.h"

extern const tsr_sched_desc tsr_sched_gpipe, tsr_sched_1f1b, tsr_sched_interleaved,
    tsr_sched_zb_h1, tsr_sched_zb_v;

static const tsr_sched_desc *const all[TSR_SCHEDULE_COUNT] = {
    &tsr_sched_gpipe, &tsr_sched_1f1b, &tsr_sched_interleaved, &tsr_sched_zb_h1, &tsr_sched_zb_v};

const tsr_sched_desc *tsr_sched(tsr_schedule_choice id) {
  return id >= 0 && id < TSR_SCHEDULE_COUNT ? all[id] : NULL;
}

tsr_schedule_choice tsr_sched_for(tsr_sched_placement placement, int v) {
  if (placement == TSR_PLACE_ROUND && v <= 1) return TSR_SCHEDULE_DEFAULT;
  for (int i = 0; i < TSR_SCHEDULE_COUNT; i++)
    if (all[i]->placement == placement && (placement != TSR_PLACE_ROUND || all[i]->chunks == 0))
      return i;
  return TSR_SCHEDULE_DEFAULT;
}

unsigned tsr_sched_broken(const tsr_sched_desc *d, int pp, int v, int m, int recompute) {
  unsigned broken = 0;
  if (pp < d->min_pp) broken |= 1u << TSR_SCHED_FEW_STAGES;
  if (d->split_backward && recompute > 0) broken |= 1u << TSR_SCHED_RECOMPUTE;
  if (d->chunks > 1 && v != d->chunks) broken |= 1u << TSR_SCHED_CHUNK_COUNT;
  else if (d->chunks == 1 && v > 1) broken |= 1u << TSR_SCHED_NOT_CHUNKED;
  if (v > 1 && pp < 2) broken |= 1u << TSR_SCHED_ONE_STAGE;
  if (v > 1 && d->chunked_divides && m >= 1 && pp >= 1 && m % pp)
    broken |= 1u << TSR_SCHED_MICRO_BATCHES;
  return broken;
}

const char *tsr_sched_chunked_words(void) {
  static char text[128];
  if (!text[0]) {
    size_t o = 0;
    int n = 0;
    for (int i = 0; i < TSR_SCHEDULE_COUNT; i++)
      if (all[i]->chunks != 1) n++;
    for (int i = 0, k = 0; i < TSR_SCHEDULE_COUNT && o < sizeof text; i++)
      if (all[i]->chunks != 1)
        o += (size_t)snprintf(text + o, sizeof text - o, "%s'%s'",
                              k++ == 0 ? "" : k == n ? " or " : ", ", all[i]->word);
  }
  return text;
}
