/* registry.h — the pipeline schedules Tessera has, in the order parallel.schedule's words
 * are numbered (the value config.h's tsr_schedule_choice holds is this index).  Adding a
 * schedule: one file of src/sched/ that fills a tsr_sched_desc (schedule.h), its line in
 * the list below, in TSR_SCHED_WORDS and in registry.c; nothing else in the code names it.
 * tests/unit/sched/test_schedule.c checks that the three lists agree. */
#ifndef TSR_SCHED_REGISTRY_H
#define TSR_SCHED_REGISTRY_H

enum {
  TSR_SCHEDULE_GPIPE,
  TSR_SCHEDULE_1F1B,
  TSR_SCHEDULE_INTERLEAVED,
  TSR_SCHEDULE_ZB_H1,
  TSR_SCHEDULE_ZB_V,
  TSR_SCHEDULE_COUNT
};
/* the deck's words for them, in the same order (the deck schema's choice list) */
#define TSR_SCHED_WORDS "gpipe|1f1b|interleaved|zb_h1|zb_v"
/* parallel.schedule's default, and the schedule a layout without a V runs on (tessera plan,
 * the layout table's checks) */
#define TSR_SCHEDULE_DEFAULT TSR_SCHEDULE_1F1B

#endif
