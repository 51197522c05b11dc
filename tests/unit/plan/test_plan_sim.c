/* test_plan_sim.c — the planner's time model (src/plan/plan_sim.c, plan_cost.c, plan_profile.c)
 * on cases worked out by hand:
 *
 *  1. two stages under 1F1B, 4 micro-batches, forward 1 and backward 2 time units per
 *     chunk, free transfers: the step is (m + p - 1)(f + b) = 15 and the bubble over it
 *     the closed form (p - 1)/(m + p - 1) = 0.2; with 0.25 per message the timeline below
 *     (written out action by action) ends at 16, the last stage's schedule at 13.75;
 *  2. with free transfers and equal chunks the replay's bubble equals pipeline.c's closed
 *     forms for gpipe, 1f1b, interleaved, zb_h1 and zb_v (F = B = W; zb_v's V placement
 *     with its bend on one stage), several pp, m, v;
 *  3. data-parallel reductions queued behind the backward: one piece, two pieces, every
 *     micro-batch; ZeRO 3's gather before a computation;
 *  4. the prices of a message and of ring collectives on a machine with round numbers;
 *  5. a chunk's forward on a machine with a flat efficiency and memory made free: its
 *     FLOPs counted by hand from the shapes (four GEMMs per layer, causal attention, the
 *     head), at that fraction of the peak; with tp 2 its all-reduces on a known link;
 *  6. the deck's profile keys replace the built-in figures; 'reference' is its own table;
 *  7. many micro-batches: 4096 on pp 4 under 1f1b, interleaved, zb_h1 and zb_v, with
 *     uneven chunks, links of their own and reductions (after the last micro-batch, after
 *     every one on a link slower than the compute, ZeRO 3's gathers) extrapolated from two
 *     short replays, within 1e-9 of the full replay in every stage's end, busy time, last
 *     reduction and idle fraction; up to the window's m1 the same bits as the full replay. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "deck/deck.h"
#include "sched/registry.h"
#include "sched/pipeline.h"
#include "plan/plan.h"
#include "plan/plan_sim.h"
#include "testutil.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1, fabs(b)); }

/* One replay with every chunk alike (f, b, w), one link time for every neighbour pair. */
static int replay(tsr_schedule_choice kind, int pp, int m, int v, double f, double b, double w,
                  double link, double *end, double *busy) {
  double F[64], B[64], Wt[64], L[16], reduced[16];
  for (int c = 0; c < pp * v; c++) F[c] = f, B[c] = b, Wt[c] = w;
  for (int s = 0; s < pp; s++) L[s] = link;
  const tsr_plan_sim_in in = {kind, pp, m, v, F, B, w > 0 ? Wt : NULL, L, NULL, NULL, 0, NULL};
  tsr_plan_sim_out out = {end, busy, reduced};
  return tsr_plan_simulate(&in, &out);
}

static void test_two_stages(void) {
  double end[2], busy[2];
  int rc = replay(TSR_SCHEDULE_1F1B, 2, 4, 1, 1, 2, 0, 0, end, busy);
  const double step = fmax(end[0], end[1]), bubble = 1 - (busy[0] + busy[1]) / 2 / step;
  TU_CHECK(rc == 0 && near(step, 15) && near(busy[0], 12) && near(busy[1], 12) &&
               near(bubble, 1.0 / 5),
           "1f1b, 2 stages, m 4, F 1, B 2, free links: step %g (15), busy %g %g (12), bubble %g "
           "(1/5)", step, busy[0], busy[1], bubble);
  /* 0.25 per message.  Stage 0 runs F0 F1 B0 F2 B1 F3 B2 B3, stage 1 F0 B0 F1 B1 ...:
   *   S0 F0 [0,1] F1 [1,2];  S1 F0 [1.25,2.25] B0 [2.25,4.25];  S0 B0 [4.5,6.5] F2 [6.5,7.5];
   *   S1 F1 [4.25,5.25] B1 [5.25,7.25];  S0 B1 [7.5,9.5] F3 [9.5,10.5];
   *   S1 F2 [7.75,8.75] B2 [8.75,10.75];  S0 B2 [11,13];  S1 F3 [10.75,11.75] B3 [11.75,13.75];
   *   S0 B3 [14,16]. */
  rc = replay(TSR_SCHEDULE_1F1B, 2, 4, 1, 1, 2, 0, 0.25, end, busy);
  TU_CHECK(rc == 0 && near(end[0], 16) && near(end[1], 13.75) && near(busy[0], 12),
           "the same with 0.25 per message: stage 0 ends at %g (16), stage 1 at %g (13.75); the "
           "trainer's idle line: %.4f %.4f (4/16, 1.75/13.75)", end[0], end[1],
           1 - busy[0] / end[0], 1 - busy[1] / end[1]);
}

static void test_closed_forms(void) {
  const struct {
    const char *kind;
    int pp, m, v;
  } cases[] = {{"gpipe", 2, 4, 1},       {"gpipe", 4, 8, 1},       {"1f1b", 4, 3, 1},
               {"1f1b", 8, 16, 1},       {"interleaved", 2, 4, 2}, {"interleaved", 4, 8, 2},
               {"interleaved", 4, 8, 3}, {"zb_h1", 2, 6, 1},       {"zb_h1", 4, 8, 1},
               {"zb_h1", 4, 2, 1},       {"zb_v", 2, 6, 2},        {"zb_v", 4, 8, 2},
               {"zb_v", 4, 3, 2}};
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const tsr_schedule_choice k =
        (tsr_schedule_choice)tu_word("gpipe|1f1b|interleaved|zb_h1|zb_v", cases[i].kind);
    const int split = k == TSR_SCHEDULE_ZB_H1 || k == TSR_SCHEDULE_ZB_V, pp = cases[i].pp;
    double end[16], busy[16], step = 0, mean = 0;
    if (replay(k, pp, cases[i].m, cases[i].v, 1, split ? 1 : 2, split ? 1 : 0, 0, end, busy)) {
      bad++;
      continue;
    }
    for (int s = 0; s < pp; s++) step = fmax(step, end[s]), mean += busy[s] / pp;
    const double want = tsr_pp_ideal_bubble(k, pp, cases[i].m, cases[i].v);
    if (!near(1 - mean / step, want)) {
      printf("    %s pp %d m %d v %d: replayed bubble %.6f, closed form %.6f\n", cases[i].kind,
             pp, cases[i].m, cases[i].v, 1 - mean / step, want);
      bad++;
    }
  }
  TU_CHECK(bad == 0, "free links, equal chunks: the replay's bubble is pipeline.c's closed form "
           "in %zu cases (gpipe, 1f1b, interleaved v 2-3, zb_h1 and zb_v with m < pp too)",
           sizeof cases / sizeof cases[0]);
}

/* pp 1, 2 micro-batches, F 1, B 2: F0 [0,1] B0 [1,3] F1 [3,4] B1 [4,6]. */
static double one_stage(double reduce, int pieces, int every, double gather, int m,
                        double *end) {
  double f = 1, b = 2, r = reduce, g = gather, busy, reduced;
  const tsr_plan_sim_in in = {TSR_SCHEDULE_1F1B, 1, m, 1, &f, &b, NULL, NULL, &r, &pieces,
                              every, gather > 0 ? &g : NULL};
  tsr_plan_sim_out out = {end, &busy, &reduced};
  return tsr_plan_simulate(&in, &out) ? -1 : reduced;
}

static void test_reductions(void) {
  double end;
  const double one = one_stage(5, 1, 0, 0, 2, &end);
  TU_CHECK(near(one, 11) && near(end, 6), "a 5-unit reduction after the last backward (ends at "
           "6): done at %g (11)", one);
  /* two pieces of 2.5, released at 5 and 6: [5, 7.5], [7.5, 10] */
  const double two = one_stage(5, 2, 0, 0, 2, &end);
  TU_CHECK(near(two, 10), "in two pieces released as the backward [4, 6] proceeds: done at %g "
           "(10)", two);
  /* every micro-batch: [3, 8] after B0, then [8, 13] after B1 */
  const double every = one_stage(5, 1, 1, 0, 2, &end);
  TU_CHECK(near(every, 13), "after every micro-batch's backward (ZeRO 2-3): done at %g (13)",
           every);
  /* ZeRO 3, one micro-batch, gathers of 0.5: F waits for its gather [0, 0.5] and runs
   * [0.5, 1.5]; B's gather [0.5, 1] is in before F ends, B runs [1.5, 3.5] */
  one_stage(0, 1, 1, 0.5, 1, &end);
  TU_CHECK(near(end, 3.5), "ZeRO 3 gathers of 0.5 before F (1) and B (2): the stage ends at %g "
           "(3.5)", end);
}

/* A 'custom' machine with round numbers; the profile's figures as given. */
static tsr_hardware machine(const char *overrides_extra) {
  tsr_config c;
  tsr_deck_defaults(&c);
  char *over[] = {"hardware.name=custom", "hardware.peak_tflops=100",
                  "hardware.peak_fp32_tflops=10", "hardware.hbm_gb=80", "hardware.hbm_gbps=1e9",
                  "hardware.intra_node_gbps=100", "hardware.inter_node_gbps=10",
                  "hardware.gpus_per_node=8", "hardware.intra_node_efficiency=0.5",
                  "hardware.inter_node_efficiency=0.8", "hardware.intra_node_latency_us=10",
                  "hardware.inter_node_latency_us=20", "hardware.kernel_us=1e-12",
                  "hardware.compute_efficiency=0.5", (char *)overrides_extra};
  char err[4096];
  tsr_hardware hw;
  memset(&hw, 0, sizeof hw);
  if (tsr_deck_parse(&c, "", 0, "test", overrides_extra ? 15 : 14, over, 1, err, sizeof err) ||
      tsr_plan_hardware(&c.hardware, &hw))
    printf("    no machine: %s\n", err);
  return hw;
}

static void test_prices(void) {
  const tsr_hardware hw = machine(NULL);
  /* 1 GB over NVLink at 0.5 x 100 GB/s in 2 messages of 10 us: 0.02 + 2e-5 s */
  const double msg = tsr_plan_link_s(&hw, TSR_LINK_INTRA, 1e9, 2);
  /* all-reduce of 8 GB over 8 ranks: 2 x 7/8 x 8 GB = 14 GB at 40 GB/s, 2 x 3 rounds of
   * 20 us; a reduce-scatter over 4 ranks: 6 GB at 40 GB/s, 2 rounds */
  const double ar = tsr_plan_all_reduce_s(&hw, TSR_LINK_INTER, 8, 8e9);
  const double rs = tsr_plan_gather_s(&hw, TSR_LINK_INTER, 4, 8e9);
  TU_CHECK(near(msg, 0.02002) && near(ar, 14.0 / 8 + 120e-6) && near(rs, 6.0 / 8 + 40e-6),
           "1 GB in 2 messages over a 100 GB/s link at 0.5: %.6g s (0.02002); ring all-reduce "
           "of 8 GB over 8 ranks at 10 GB/s x 0.8: %.6g s (1.75012); reduce-scatter over 4: "
           "%.6g s (0.75004)", msg, ar, rs);
  /* a GEMM at the flat 0.5 of 100 TFLOP/s (16-bit) and of 10 (fp32) */
  const double g16 = tsr_plan_gemm_s(&hw, 1, 1000, 2000, 3000);
  const double g32 = tsr_plan_gemm_s(&hw, 0, 1000, 2000, 3000);
  TU_CHECK(fabs(g16 - 12e9 / 50e12) < 1e-12 && fabs(g32 - 12e9 / 5e12) < 1e-12,
           "a 1000 x 3000 x 2000 GEMM (12 GFLOP) at half of 100 and 10 TFLOP/s: %.6g s, %.6g s",
           g16, g32);
}

static void test_chunk_by_hand(void) {
  const tsr_hardware hw = machine(NULL);
  tsr_config c;
  tsr_deck_defaults(&c);
  char *over[] = {"model.arch=llama", "model.n_layer=4", "model.d_model=256",
                  "model.n_head=8", "model.n_kv_head=4", "model.d_ff=512",
                  "model.vocab_size=1000", "model.seq_len=128", "train.micro_batch=2",
                  "train.global_batch=8", "parallel.pp=2", "train.precision=bf16",
                  "train.recompute=none", "model.tie_embeddings=F"};
  char err[4096];
  tsr_plan_grid g;
  tsr_plan_chunk first, last;
  int rc = tsr_deck_parse(&c, "", 0, "test", 14, over, 2, err, sizeof err);
  if (rc) printf("    %s", err);
  if (!rc) rc = tsr_plan_layout(&c, 2, 2, &g, NULL, 0);
  if (!rc) rc = tsr_plan_chunk_cost(&c, &hw, &g, 0, &first);
  if (!rc) rc = tsr_plan_chunk_cost(&c, &hw, &g, 1, &last);
  /* 2 layers per chunk, N = 256 tokens, C 256, 8 heads of 32, 4 KV heads, F 512, V 1000 */
  const double N = 256, C = 256, hd = 32, H = 8, KV = 4, F = 512, V = 1000, T = 128, B = 2;
  const double layer = 2 * N * (C * (H + 2 * KV) * hd + H * hd * C + C * 2 * F + F * C);
  const double attn = 2 * B * H * T * T * hd;
  const double rate = 100e12 * 0.5;
  const double want_first = 2 * (layer + attn) / rate;
  const double want_last = want_first + 2 * N * C * V / rate; /* the head's GEMM */
  /* the backward: each GEMM twice (input and weight gradients), attention 2.5 x */
  const double want_back = 2 * (2 * layer + 2.5 * attn) / rate;
  TU_CHECK(rc == 0 && fabs(first.f - want_first) <= 1e-6 * want_first &&
               fabs(last.f - want_last) <= 1e-6 * want_last &&
               fabs(first.b - want_back) <= 1e-6 * want_back && first.w == 0,
           "llama chunk of 2 layers, 256 tokens, bf16 at 0.5 of 100 TFLOP/s, memory free: forward "
           "%.6g s (by hand %.6g), last chunk with the head %.6g (%.6g), backward %.6g (%.6g)",
           first.f, want_first, last.f, want_last, first.b, want_back);
}

/* tp 2 on the same chunk: its forward's collectives on the critical path, two all-reduces
 * of the [N, C] activation per layer and the vocab-parallel lookup's one, each over the
 * 100 GB/s link at 0.5: 2 x 1/2 x A bytes in 2 messages of 10 us. */
static void test_tp_by_hand(void) {
  const tsr_hardware hw = machine(NULL);
  tsr_config c;
  tsr_deck_defaults(&c);
  char *over[] = {"model.arch=llama", "model.n_layer=4", "model.d_model=256", "model.n_head=8",
                  "model.n_kv_head=4", "model.d_ff=512", "model.vocab_size=1000",
                  "model.seq_len=128", "train.micro_batch=2", "train.global_batch=8",
                  "parallel.pp=2", "parallel.tp=2", "train.precision=bf16",
                  "parallel.sequence_parallel=F"};
  char err[4096];
  tsr_plan_grid g;
  tsr_plan_chunk ch;
  int rc = tsr_deck_parse(&c, "", 0, "test", 14, over, 4, err, sizeof err);
  if (!rc) rc = tsr_plan_layout(&c, 4, 4, &g, NULL, 0);
  if (!rc) rc = tsr_plan_chunk_cost(&c, &hw, &g, 0, &ch);
  const double A = 256 * 256 * 2.0, ar = 2 * 10e-6 + A / 50e9;
  TU_CHECK(rc == 0 && near(ch.f_tp, 5 * ar) && near(ch.b_tp, 4 * ar),
           "tp 2: the first chunk's forward waits %.6g s on all-reduces (5 of %.6g s: 2 per layer "
           "and the lookup's), its backward %.6g s (4: 2 per layer)", ch.f_tp, ar, ch.b_tp);
}

static void test_profile_keys(void) {
  tsr_config c;
  tsr_deck_defaults(&c);
  tsr_hardware t, r, set;
  int rc = tsr_plan_hardware(&c.hardware, &t);
  c.hardware.implementation = TSR_IMPL_REFERENCE;
  rc |= tsr_plan_hardware(&c.hardware, &r);
  c.hardware.gemm_efficiency = 0.5;
  c.hardware.attention_half_seq = 1000;
  c.hardware.kernel_us = 7;
  c.hardware.tp_overlap = 0;
  rc |= tsr_plan_hardware(&c.hardware, &set);
  TU_CHECK(rc == 0 && t.prof.tp_overlap == 0 && r.prof.tp_overlap > 0 &&
               r.prof.attn_fwd[1] > t.prof.attn_fwd[1] && set.prof.gemm_eff[1] == 0.5 &&
               set.prof.attn_half_seq == 1000 && near(set.prof.kernel_s, 7e-6) &&
               set.prof.tp_overlap == 0 && set.prof.attn_fwd[1] == r.prof.attn_fwd[1],
           "h100: 'tessera' overlaps no tp (%g), 'reference' does (%g) with faster attention "
           "(%.3g > %.3g of peak); deck keys replace figures: gemm %g, half seq %g, kernel %g us, "
           "tp_overlap %g", t.prof.tp_overlap, r.prof.tp_overlap, r.prof.attn_fwd[1],
           t.prof.attn_fwd[1], set.prof.gemm_eff[1], set.prof.attn_half_seq,
           set.prof.kernel_s * 1e6, set.prof.tp_overlap);
}

/* Uneven chunks, links and reductions: `mode` 0 reduces after the last micro-batch, 1 after
 * every one (its link the slower: the reductions set the pace), 2 also gathers (ZeRO 3). */
static int uneven(tsr_schedule_choice kind, int pp, int v, int m, int mode, int full,
                  double *end, double *busy, double *reduced) {
  double F[16], B[16], W[16], L[8], R[16], G[16];
  int P[16];
  const int split = kind == TSR_SCHEDULE_ZB_H1 || kind == TSR_SCHEDULE_ZB_V;
  for (int c = 0; c < pp * v; c++) {
    F[c] = 1 + 0.13 * c + (c == pp * v - 1 ? 0.7 : 0); /* the head on the last chunk */
    B[c] = (split ? 1.1 : 2.05) * F[c] + 0.01 * c, W[c] = 0.9 * F[c];
    R[c] = mode == 1 ? 6 + 0.5 * c : 0.5 + 0.2 * c, G[c] = 0.3, P[c] = 2 + c % 3;
  }
  for (int s = 0; s < pp; s++) L[s] = 0.05 + 0.01 * s;
  const tsr_plan_sim_in in = {kind, pp, m, v, F, B, split ? W : NULL, L, R, P, mode > 0,
                              mode == 2 ? G : NULL};
  tsr_plan_sim_out out = {end, busy, reduced};
  return full ? tsr_plan_simulate_full(&in, &out) : tsr_plan_simulate(&in, &out);
}

static void test_many_micro_batches(void) {
  const struct {
    tsr_schedule_choice kind;
    int v;
  } kinds[] = {{TSR_SCHEDULE_1F1B, 1}, {TSR_SCHEDULE_INTERLEAVED, 2}, {TSR_SCHEDULE_ZB_H1, 1},
               {TSR_SCHEDULE_ZB_V, 2}};
  const int pp = 4, m = 4096;
  const double tol = 1e-9;
  int bad = 0, cases = 0, extrapolated = 0, same = 0;
  double worst = 0;
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
    for (int mode = 0; mode < 3; mode++) {
      const int v = kinds[k].v;
      double e[2][4], b[2][4], r[2][4];
      int m0, m1;
      extrapolated += tsr_plan_sim_window(pp, v, m, &m0, &m1);
      cases++;
      if (uneven(kinds[k].kind, pp, v, m, mode, 0, e[0], b[0], r[0]) ||
          uneven(kinds[k].kind, pp, v, m, mode, 1, e[1], b[1], r[1])) {
        bad++;
        continue;
      }
      for (int s = 0; s < pp; s++) {
        const double d[4] = {e[0][s] / e[1][s] - 1, b[0][s] / b[1][s] - 1,
                             r[0][s] / r[1][s] - 1,
                             (1 - b[0][s] / e[0][s]) - (1 - b[1][s] / e[1][s])};
        for (int j = 0; j < 4; j++) worst = fmax(worst, fabs(d[j]));
        if (fabs(d[0]) > tol || fabs(d[1]) > tol || fabs(d[2]) > tol || fabs(d[3]) > tol) {
          printf("    kind %d mode %d stage %d: end %.12g (full %.12g), busy %.12g (%.12g), "
                 "reduced %.12g (%.12g)\n", (int)kinds[k].kind, mode, s, e[0][s], e[1][s],
                 b[0][s], b[1][s], r[0][s], r[1][s]);
          bad++;
        }
      }
      /* small m: the largest that still replays in full, and one well inside */
      const int small[2] = {m1, 40};
      for (int i = 0; i < 2; i++) {
        int s0, s1;
        if (tsr_plan_sim_window(pp, v, small[i], &s0, &s1)) continue;
        if (!uneven(kinds[k].kind, pp, v, small[i], mode, 0, e[0], b[0], r[0]) &&
            !uneven(kinds[k].kind, pp, v, small[i], mode, 1, e[1], b[1], r[1]) &&
            !memcmp(e[0], e[1], sizeof e[0]) && !memcmp(b[0], b[1], sizeof b[0]) &&
            !memcmp(r[0], r[1], sizeof r[0]))
          same++;
      }
    }
  TU_CHECK(bad == 0 && extrapolated == cases, "m %d on pp %d, 1f1b, interleaved, zb_h1, zb_v, "
           "3 kinds of reduction: %d of %d extrapolated, every stage's end, busy, last "
           "reduction and idle fraction within %g of the full replay (worst %.3g)", m, pp,
           extrapolated, cases, tol, worst);
  TU_CHECK(same == 2 * cases, "m up to the window (m1, 40): the full replay's bits in %d of %d "
           "cases", same, 2 * cases);
}

int main(void) {
  test_two_stages();
  test_closed_forms();
  test_reductions();
  test_prices();
  test_chunk_by_hand();
  test_tp_by_hand();
  test_profile_keys();
  test_many_micro_batches();
  return tu_summary("test_plan_sim");
}
