/* test_plan.c — the planner (src/plan/plan.c) against independent references:
 *
 *  1. the seeds' worked numbers: 7B parameters in fp32 are 28 GB of weights and 112 GB with
 *     gradients and Adam (16 bytes per parameter); ZeRO-1/2/3 on 4 GPUs 70, 49, 28 GB (the
 *     optimizer state, then + gradients, then + weights split four ways); mixed precision
 *     14 GB bf16 weights + 28 GB fp32 master; the same arithmetic from the llm7b deck's own
 *     tensor table (6.74 B parameters);
 *  2. layouts that do not divide are refused with messages naming the deck keys and values;
 *  3. the built-in hardware tables (NVIDIA's datasheet figures) and the 'custom' checks;
 *  4. the in-flight activation sets of the closed forms equal the generated schedules' peak
 *     (pipeline.c), for gpipe, 1f1b and interleaved, every stage;
 *  5. the CPU build's figure of what the model allocates equals the bytes tsr_model_create_opt
 *     actually allocates (tsr_mem_bytes), for llama and gpt2, every recompute mode, bf16,
 *     pipeline parts, several activation slots;
 *  6. tensor-parallel traffic per layer equals Megatron's count 4 x 2(T-1)/T x b s h x 4 bytes
 *     (bench/tp.sh's reference) and ZeRO traffic the ring formulas of tests/mpi/test_zero.c;
 *  7. FLOPs per token equal 6 N + 6 L T d with N counted from the shapes by hand, the
 *     bubble of llm70b's interleaved layout is (p-1)/(v m+p-1) with Megatron's warm-up in
 *     flight, and with a flat hardware.compute_efficiency a stage's compute time is its
 *     FLOPs at that fraction of the datasheet peak of its precision: bf16 tensor cores,
 *     or fp32 without them (the CUDA GEMMs compute in fp32 with TF32 off).  The profile's
 *     curves and the replay of the schedule are tests/unit/plan/test_plan_sim.c's;
 *  8. document masking: the share of the causal attention's pairs left for documents of a
 *     mean length against a sum over the positions and a simulated stream of documents,
 *     and the model FLOPs and a stage's compute time lose exactly that share's complement
 *     of the attention;
 *  9. context parallelism (docs/context_parallel.md "What the planner counts"): the grid
 *     (dp = world / (tp cp pp), ZeRO over dp x cp), a cp rank's activations exactly 1/cp
 *     of cp 1's, the ring's and the all-to-alls' buffers and traffic by the formulas,
 *     counted by hand, the dp x cp gradient reduction, FLOPs per GPU 1/cp with the model
 *     FLOPs unchanged, the ring's block attention 1/cp of the whole causal attention's
 *     time and its hops hidden behind it on a fast link, not on a slow one; the
 *     Llama 3 8B 128k deck fits on 8 nodes of H100s (tests/e2e/plan_cp.sh: its search and
 *     the command's layout errors);
 * 10. the optimizer offload (parallel.offload = 'optimizer', docs/offload.md): the device
 *     and host columns by zero.c's buffers, exactly, at ZeRO 1 and 3 in bf16 and fp32 (12
 *     or 8 bytes a parameter of the shard off the device, 18 or 16 on the host) and for a
 *     half fraction; the CPU build's column untouched; the PCIe bytes (4 + 2 or 4 a
 *     parameter of the shard), the CPU AdamW's bytes (30 or 28) and their times at the
 *     hardware figures; the step longer by the update the trainer pipelines in pieces (at
 *     ZeRO 1 after the backward, at ZeRO 2 with the gradient on the host already, at
 *     ZeRO 3 behind the next first forward) less the device's AdamW, each by hand; the
 *     gradient on the host with hybrid replicas; the built-in host figures; the
 *     host-memory verdict per node; parallel.offload holds the search;
 * 11. the activation offload (train.activation_offload): the GPU column's activations and
 *     the host column against a layer's stored set, a row and the 256-byte-rounded block
 *     counted by hand, in bf16 and fp32 and every recompute mode; the CPU column untouched;
 *     a chunk's forward and backward longer by what PCIe does not hide of a block a layer
 *     (f + L max(0, block / pcie - f / L)), on a slow link, and by nothing on the H100's;
 *     the blocks a step moves; train.activation_offload holds the search.
 * No MPI: the model runs without a tp group (tp = 1) here; tests/e2e/plan.sh compares the
 * trainer's measured memory and traffic under real multi-rank layouts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "deck/deck.h"
#include "sched/registry.h"
#include "model/model.h"
#include "sched/pipeline.h"
#include "plan/plan.h"
#include "plan/plan_sim.h"
#include "parallel/zero.h"
#include "testutil.h"
#include "core/util.h"

static int close_to(double got, double want, double rel) {
  return fabs(got - want) <= rel * fabs(want);
}

static void test_seed_arithmetic(void) {
  const double N = 7e9, GB = 1e9;
  tsr_plan_memory m = tsr_plan_state(N, 0, 1, 0, 0);
  TU_CHECK(m.params == 28 * GB && m.total == 112 * GB,
           "7B fp32: weights %.1f GB (seed: 28), with gradients and Adam %.1f GB (seed: 112)",
           m.params / GB, m.total / GB);
  const double want[4] = {112, 70, 49, 28};
  for (int z = 1; z <= 3; z++) {
    m = tsr_plan_state(N, z, 4, 0, 0);
    TU_CHECK(close_to(m.total, want[z] * GB, 1e-12),
             "7B fp32 ZeRO-%d on 4 GPUs: %.1f GB per GPU (seed: %.0f; weights %.1f, grads %.2f, "
             "Adam %.1f)", z, m.total / GB, want[z], m.params / GB, m.grads / GB, m.optim / GB);
  }
  m = tsr_plan_state(N, 0, 1, 1, 0);
  TU_CHECK(m.params == 14 * GB && m.master == 28 * GB && m.optim == 56 * GB && m.grads == 28 * GB,
           "7B bf16: weights %.0f GB + fp32 master %.0f GB (seed: 14 + 28), Adam %.0f GB (seed: "
           "56), fp32 gradients %.0f GB", m.params / GB, m.master / GB, m.optim / GB, m.grads / GB);
  TU_CHECK(m.total == 126 * GB, "7B bf16 with Adam: %.0f GB = 18 B/param", m.total / GB);
}

/* Deck `name` as checked for `world` ranks. */
static tsr_config deck_on(const char *name, int world) {
  tsr_config c;
  char path[1024], err[4096];
  const char *top = getenv("top_srcdir") ? getenv("top_srcdir") : ".";
  snprintf(path, sizeof path, "%s/input/%s.nml", top, name);
  FILE *f = fopen(path, "rb");
  static char text[1 << 16];
  const size_t n = f ? fread(text, 1, sizeof text, f) : 0;
  if (f) fclose(f);
  tsr_deck_defaults(&c);
  if (!n || tsr_deck_parse(&c, text, n, path, 0, NULL, world, err, sizeof err))
    printf("    could not read %s: %s\n", path, err);
  return c;
}
static tsr_config deck(const char *name) { return deck_on(name, 512); }

/* The state of the real 7B shapes on 1 and 4 GPUs (fp32, tp = pp = 1). */
static void test_llm7b_state(void) {
  tsr_config c = deck("llm7b");
  c.parallel.tp = 1;
  c.parallel.sequence_parallel = 0;
  c.train.precision = TSR_F32;
  const double L = 32, C = 4096, F = 11008, V = 32000;
  const double N = L * (4 * C * C + 3 * C * F + 2 * C) + 2 * V * C + C; /* by hand */
  for (int z = 0; z <= 3; z++) {
    c.parallel.zero_stage = z;
    const int world = z ? 4 : 1;
    tsr_plan_grid g;
    char msg[1024];
    const int bad = tsr_plan_layout(&c, world, world, &g, msg, sizeof msg);
    tsr_plan_memory m = {0};
    const int rc = bad ? -1 : tsr_plan_stage_memory(&c, &g, 0, TSR_PLAN_GPU, &m);
    const double state = m.params + m.grads + m.master + m.optim;
    const double bytes_per = z == 0 ? 16 : z == 1 ? 10 : z == 2 ? 7 : 4;
    TU_CHECK(rc == 0 && close_to(state, bytes_per * N, 1e-6),
             "llm7b deck (%.4g parameters) fp32 ZeRO-%d on %d GPU(s): state %.2f GB = %.0f B/param "
             "(activations %.2f GB, buffers %.2f GB more)", N, z, world, state / 1e9, bytes_per,
             m.activations / 1e9, (m.comm + m.workspace) / 1e9);
  }
}

static int says(const char *msg, const char *what) {
  if (strstr(msg, what)) return 1;
  printf("    missing: \"%s\"\n", what);
  return 0;
}

static void test_divisibility(void) {
  tsr_config c = deck("llm7b");
  char msg[4096];
  tsr_plan_grid g;
  c.parallel.tp = 3;
  int n = tsr_plan_layout(&c, 8, 8, &g, msg, sizeof msg);
  printf("%s", msg);
  TU_CHECK(n == 7 && says(msg, "parallel.tp = 3 does not divide model.n_head = 32") &&
               says(msg, "parallel.tp = 3 and model.n_kv_head = 32: one must divide the other") &&
               says(msg, "parallel.tp = 3 does not divide model.d_ff = 11008") &&
               says(msg, "parallel.tp = 3 does not divide model.vocab_size = 32000") &&
               says(msg, "parallel.tp = 3 does not divide model.seq_len = 4096") &&
               says(msg, "parallel.tp = 3 does not divide the 8 ranks per node") &&
               says(msg, "world size 8 is not a multiple of parallel.tp = 3 * parallel.pp = 1 = 3"),
           "tp 3 on one node of 8: %d problems, each naming the keys and their values", n);
  c = deck("llm7b");
  c.parallel.pp = 5;
  c.train.micro_batch = 3;
  n = tsr_plan_layout(&c, 64, 8, &g, msg, sizeof msg);
  printf("%s", msg);
  TU_CHECK(n == 2 && says(msg, "parallel.pp = 5 does not divide model.n_layer = 32") &&
               says(msg, "world size 64 is not a multiple of parallel.tp = 8 * parallel.pp = 5 = "
                         "40"),
           "pp 5 on 64 GPUs: layers and world size named");
  c.parallel.pp = 1;
  n = tsr_plan_layout(&c, 64, 8, &g, msg, sizeof msg);
  printf("%s", msg);
  TU_CHECK(n == 1 && says(msg, "train.global_batch = 1024 is not a multiple of "
                               "train.micro_batch = 3 * dp 8 = 24"),
           "micro_batch 3: the batch split named");
  c.train.micro_batch = 1;
  c.parallel.shard_scope = TSR_SHARD_NODE;
  n = tsr_plan_layout(&c, 64, 8, &g, msg, sizeof msg);
  TU_CHECK(n == 0 && g.dp == 8 && g.shard == 1 && g.replicate == 8 && g.micro_batches == 128,
           "llm7b on 8 x 8 with shard_scope 'node': dp %d = shard %d x %d copies, %d micro-batches",
           g.dp, g.shard, g.replicate, g.micro_batches);
}

static void test_hardware(void) {
  tsr_config c;
  tsr_deck_defaults(&c);
  tsr_hardware hw;
  /* NVIDIA's SXM datasheets: dense bf16 tensor-core and fp32 (no tensor core) TFLOP/s */
  const struct { const char *name; double tflops, fp32, gb, gbps; } want[] = {
      {"h100", 989, 67, 80, 3350}, {"h200", 989, 67, 141, 4800}, {"a100", 312, 19.5, 80, 2039}};
  for (int i = 0; i < 3; i++) {
    c.hardware.name = (tsr_hw_name)tu_word("h100|h200|a100|custom", want[i].name);
    const int rc = tsr_plan_hardware(&c.hardware, &hw);
    TU_CHECK(rc == 0 && hw.peak_tflops == want[i].tflops && hw.peak_fp32_tflops == want[i].fp32 &&
                 hw.hbm_gb == want[i].gb && hw.hbm_gbps == want[i].gbps && hw.gpus_per_node == 8,
             "built-in %s: %.0f TFLOP/s bf16, %.3g fp32, %.0f GB, %.0f GB/s, %d per node",
             want[i].name, hw.peak_tflops, hw.peak_fp32_tflops, hw.hbm_gb, hw.hbm_gbps,
             hw.gpus_per_node);
  }
  c.hardware.hbm_gb = 96;
  TU_CHECK(tsr_plan_hardware(&c.hardware, &hw) == 0 && hw.hbm_gb == 96 && hw.peak_tflops == 312,
           "a deck figure overrides the table's (a100 with hbm_gb = 96)");
  c.hardware.name = TSR_HW_CUSTOM;
  TU_CHECK(tsr_plan_hardware(&c.hardware, &hw) == TSR_ERR_INPUT,
           "'custom' without every figure is refused (bad input)");
  c.hardware.peak_tflops = 100, c.hardware.hbm_gbps = 1000, c.hardware.intra_node_gbps = 100;
  c.hardware.inter_node_gbps = 10, c.hardware.gpus_per_node = 4;
  TU_CHECK(tsr_plan_hardware(&c.hardware, &hw) == TSR_ERR_INPUT,
           "'custom' without hardware.peak_fp32_tflops is refused (bad input)");
  c.hardware.peak_fp32_tflops = 10;
  TU_CHECK(tsr_plan_hardware(&c.hardware, &hw) == 0 && hw.gpus_per_node == 4 &&
               hw.peak_fp32_tflops == 10,
           "'custom' with every figure is taken as given");
}

static void test_in_flight(void) {
  const char *kinds[] = {"gpipe", "1f1b", "interleaved", "zb_h1", "zb_v"};
  int bad = 0, cases = 0;
  for (int k = 0; k < 5; k++)
    for (int pp = 2; pp <= 4; pp++)
      for (int m = k == 4 ? 1 : pp; m <= 3 * pp; m += k == 4 ? 1 : pp) /* zb_v: any m */
        for (int v = k == 4 ? 2 : 1; v <= (k == 2 ? 3 : k == 4 ? 2 : 1); v++)
          for (int s = 0; s < pp; s++) {
            tsr_pp_schedule *sc;
            if (tsr_pp_schedule_create(&sc, (tsr_schedule_choice)k, pp, s, m, v)) {
              bad++;
              continue;
            }
            const int want = tsr_pp_peak_in_flight(sc);
            const int got = tsr_plan_in_flight((tsr_schedule_choice)k, pp, s, m, v);
            if (got != want) {
              printf("    %s pp %d m %d v %d stage %d: closed form %d, schedule %d\n", kinds[k],
                     pp, m, v, s, got, want);
              bad++;
            }
            cases++;
            tsr_pp_schedule_destroy(&sc);
          }
  TU_CHECK(bad == 0, "activation sets in flight: closed forms = generated schedules in %d cases",
           cases);
}

/* The planner's figure of the model's own allocation against the real one (returned);
 * head_chunk >= 0 sets train.xent_chunk_tokens (else the default). */
static int64_t head_chunk = -1;
static double model_case_kind(const char *kind, const char *arch, const char *recompute,
                              const char *precision, int pp, int v, int stage, int zero,
                              int tied, int n_layer, const char *split) {
  tsr_config c;
  tsr_deck_defaults(&c);
  c.model.arch = (tsr_arch)tu_word("llama|gpt2", arch);
  snprintf(c.parallel.stage_layers, sizeof c.parallel.stage_layers, "%s", split);
  c.model.n_layer = n_layer, c.model.d_model = 64, c.model.n_head = 4;
  c.model.n_kv_head = strcmp(arch, "gpt2") ? 2 : 4;
  c.model.d_ff = 160, c.model.vocab_size = 300, c.model.seq_len = 32;
  c.model.tie_embeddings = tied;
  c.parallel.pp = pp, c.parallel.virtual_stages = v, c.parallel.zero_stage = zero;
  c.parallel.schedule = kind ? (tsr_schedule_choice)tu_word("gpipe|1f1b|interleaved|zb_h1|zb_v",
                                                            kind)
                        : v > 1 ? TSR_SCHEDULE_INTERLEAVED
                                : TSR_SCHEDULE_1F1B;
  c.train.micro_batch = 2, c.train.global_batch = 2 * 2 * pp;
  c.train.recompute = (tsr_recompute)tu_word("none|selective|full", recompute);
  c.train.precision = (tsr_dtype)tu_word("fp32|bf16|fp16", precision);
  if (head_chunk >= 0) c.train.xent_chunk_tokens = head_chunk;
  tsr_plan_grid g;
  tsr_plan_memory plan;
  if (tsr_plan_layout(&c, pp, pp, &g, NULL, 0) ||
      tsr_plan_stage_memory(&c, &g, stage, TSR_PLAN_CPU, &plan)) {
    TU_CHECK(0, "%s %s: no plan", arch, recompute);
    return 0;
  }
  tsr_layout *lay;
  tsr_model *model = NULL;
  tsr_layout_create_split(&lay, &c.model, 1, 0, pp, stage, v, split, c.parallel.schedule);
  lay->n_flat = (lay->n_params + 63) / 64 * 64; /* zero.c's padding for one shard */
  const size_t before = tsr_mem_bytes();
  const tsr_model_options o = {zero < 3, zero < 2, NULL, plan.in_flight, NULL};
  tsr_model_spec spec;
  tsr_model_spec_of(&spec, &c);
  const int rc = tsr_model_create_opt(&model, &spec, lay, &o);
  const double got = (double)(tsr_mem_bytes() - before);
  /* to the byte: the buffers, and the model object with its tables as model.c counts them
   * (tsr_model_table_bytes) */
  TU_CHECK(rc == 0 && plan.model == got,
           "%s%s%s, recompute %s, %s, pp %d v %d stage %d, zero %d%s, %d layers split '%s', %d "
           "slot(s), head chunk %lld: model allocates %.0f bytes, planned %.0f",
           kind ? kind : "", kind ? " " : "", arch, recompute, precision, pp, v, stage, zero,
           tied ? ", tied" : "", n_layer, split, plan.in_flight,
           (long long)c.train.xent_chunk_tokens, got, plan.model);
  tsr_model_destroy(&model);
  tsr_layout_destroy(&lay);
  return plan.model;
}
static double model_case_split(const char *arch, const char *recompute, const char *precision,
                               int pp, int v, int stage, int zero, int tied, int n_layer,
                               const char *split) {
  return model_case_kind(NULL, arch, recompute, precision, pp, v, stage, zero, tied, n_layer,
                         split);
}
static void model_case(const char *arch, const char *recompute, const char *precision, int pp,
                       int v, int stage, int zero, int tied) {
  model_case_split(arch, recompute, precision, pp, v, stage, zero, tied, 4, "");
}

static void test_model_bytes(void) {
  const char *modes[] = {"none", "selective", "full"};
  for (int r = 0; r < 3; r++) model_case("llama", modes[r], "fp32", 1, 1, 0, 0, 0);
  for (int r = 0; r < 3; r++) model_case("gpt2", modes[r], "bf16", 1, 1, 0, 2, 1);
  model_case("llama", "none", "fp32", 2, 1, 0, 1, 0);
  model_case("llama", "selective", "fp32", 2, 1, 1, 3, 0);
  model_case("gpt2", "none", "fp32", 2, 1, 1, 0, 1);
  model_case("llama", "full", "bf16", 2, 2, 0, 1, 0);
  model_case("llama", "none", "fp32", 2, 2, 1, 0, 0);
  /* uneven splits: activation slots sized by the stage's largest chunk */
  model_case_split("llama", "none", "fp32", 2, 1, 0, 0, 0, 7, "4,3");
  model_case_split("llama", "selective", "fp32", 2, 1, 1, 1, 0, 7, "4,3");
  model_case_split("llama", "none", "fp32", 3, 1, 1, 0, 0, 7, "3,2,2");
  model_case_split("gpt2", "full", "bf16", 2, 2, 1, 0, 1, 7, "2,2,2,1");
  model_case_split("llama", "none", "fp32", 2, 2, 0, 1, 0, 7, "1,3,2,1");
  /* zb_v: stage 0 holds the embedding and the head (one embed.weight when tied), the
   * last stage the V's bend; B/W buffers per slot */
  model_case_kind("zb_h1", "llama", "none", "fp32", 2, 1, 0, 1, 0, 7, "4,3");
  model_case_kind("zb_v", "llama", "none", "fp32", 2, 2, 0, 1, 0, 7, "1,3,2,1");
  model_case_kind("zb_v", "llama", "none", "bf16", 2, 2, 1, 0, 0, 7, "1,3,2,1");
  model_case_kind("zb_v", "gpt2", "none", "fp32", 3, 2, 0, 2, 1, 6, "");
  model_case_kind("zb_v", "gpt2", "none", "bf16", 3, 2, 2, 0, 1, 6, "");
  /* the fused head in chunks of 10 of the 64 tokens against the unfused head: the planner
   * counts one chunk's logits (shared) and the targets of each slot instead of every
   * slot's logits [64, 300] */
  for (int k = 0; k < 2; k++) {
    const char *prec[2] = {"fp32", "bf16"};
    const double esz = k ? 2 : 4;
    head_chunk = 0;
    const double whole = model_case_split("gpt2", "none", prec[k], 2, 1, 1, 0, 1, 4, "");
    head_chunk = 10;
    const double fused = model_case_split("gpt2", "none", prec[k], 2, 1, 1, 0, 1, 4, "");
    const double want = 2 * 64 * 300 * esz - (10 * 300 * esz + 2 * 64 * 4);
    TU_CHECK(fabs(whole - fused - want) < 1,
             "%s: the fused head's plan is %.0f bytes below the unfused one's: 2 slots' logits "
             "less one chunk's and 2 slots' targets (%.0f)", prec[k], whole - fused, want);
  }
  head_chunk = -1;
}

/* Llama 3 405B's depth, 126 layers, on llm70b's widths over 16 stages with 'auto': 7 layers
 * on the first and the last stage, 8 on the others; every stage is planned, the fullest
 * (a middle one) is the critical and the worst in memory; a list that does not match pp
 * is refused naming the key. */
static void test_uneven(void) {
  tsr_config c = deck_on("llm70b", 128);
  c.model.n_layer = 126;
  c.parallel.pp = 16, c.parallel.virtual_stages = 1, c.parallel.schedule = TSR_SCHEDULE_1F1B;
  strcpy(c.parallel.stage_layers, "auto");
  tsr_hardware hw;
  tsr_plan_grid g;
  tsr_plan p;
  char msg[4096] = "";
  memset(&p, 0, sizeof p);
  int rc = tsr_plan_hardware(&c.hardware, &hw);
  if (!rc) rc = tsr_plan_layout(&c, 128, 8, &g, msg, sizeof msg);
  if (!rc) rc = tsr_plan_make(&p, &c, &hw, &g, 0);
  int layers_ok = rc == 0, all_done = rc == 0;
  for (int s = 0; s < 16 && rc == 0; s++) {
    layers_ok &= p.stages[s].layers == (s == 0 || s == 15 ? 7 : 8);
    all_done &= p.stages[s].done;
  }
  TU_CHECK(layers_ok && all_done, "126 layers, pp 16, auto: 7 + 14 x 8 + 7 layers, all 16 stages "
           "planned (%s)", msg);
  TU_CHECK(rc == 0 && p.stages[p.critical].layers == 8 && p.stages[p.worst[TSR_PLAN_GPU]].layers == 8 &&
               p.stages[1].flops > p.stages[0].flops,
           "the critical stage %d and the fullest in memory %d hold 8 layers", p.critical,
           p.worst[TSR_PLAN_GPU]);
  tsr_plan_destroy(&p);
  strcpy(c.parallel.stage_layers, "8,8");
  const int n = tsr_plan_layout(&c, 128, 8, &g, msg, sizeof msg);
  TU_CHECK(n == 1 && says(msg, "parallel.stage_layers = '8,8': 2 layer counts for 16 chunks"),
           "a 2-item list on pp 16 refused, naming the key");
  c.parallel.stage_layers[0] = 0;
  const int even = tsr_plan_layout(&c, 128, 8, &g, msg, sizeof msg);
  TU_CHECK(even == 1 && says(msg, "parallel.pp = 16 does not divide model.n_layer = 126"),
           "without a split, 126 layers on pp 16 are refused");
}

/* Rank traffic of one plan (stage 0) in group `grp`, kind `k`. */
static double traffic(const tsr_config *c, int world, int grp, tsr_comm_kind k) {
  tsr_plan_grid g;
  tsr_plan_traffic t[TSR_PLAN_N_GROUPS];
  if (tsr_plan_layout(c, world, world, &g, NULL, 0) || tsr_plan_stage_traffic(c, &g, 0, t))
    return -1;
  return t[grp].bytes[k];
}

static void test_traffic(void) {
  tsr_config c;
  tsr_deck_defaults(&c);
  c.model.n_layer = 2, c.model.d_model = 128, c.model.n_head = 4, c.model.n_kv_head = 4;
  c.model.d_ff = 352, c.model.vocab_size = 256, c.model.seq_len = 64;
  c.train.micro_batch = 2, c.train.global_batch = 2;
  for (int T = 2; T <= 4; T *= 2) {
    c.parallel.tp = T;
    c.model.n_layer = 2;
    const double a2 = traffic(&c, T, TSR_PLAN_TP, TSR_COMM_ALL_REDUCE);
    c.model.n_layer = 4;
    const double a4 = traffic(&c, T, TSR_PLAN_TP, TSR_COMM_ALL_REDUCE);
    const double megatron = 4 * 2.0 * (T - 1) / T * 2 * 64 * 128 * 4;
    TU_CHECK(fabs((a4 - a2) / 2 - megatron) < 1e-6,
             "tp %d: all-reduce bytes per layer %.0f = Megatron's 4 x 2(T-1)/T x b s h x 4 = %.0f",
             T,
             (a4 - a2) / 2, megatron);
  }
  c.parallel.tp = 1;
  c.train.global_batch = 2 * 2 * 4; /* k = 2 micro-batches on each of 4 ranks */
  tsr_plan_grid g;
  tsr_plan_layout(&c, 4, 4, &g, NULL, 0);
  tsr_layout *lay;
  tsr_layout_create(&lay, &c.model);
  const double B = 4.0 * (double)((lay->n_params + 255) / 256 * 256), r = 3.0 / 4;
  const double emb = 4.0 * 256 * 128; /* unit 0: embed.weight */
  tsr_layout_destroy(&lay);
  c.parallel.zero_stage = 0;
  const double ar = traffic(&c, 4, TSR_PLAN_DP, TSR_COMM_ALL_REDUCE);
  c.parallel.zero_stage = 2;
  const double rs2 = traffic(&c, 4, TSR_PLAN_DP_SHARD, TSR_COMM_REDUCE_SCATTER);
  c.parallel.zero_stage = 3;
  const double ag3 = traffic(&c, 4, TSR_PLAN_DP_SHARD, TSR_COMM_ALL_GATHER);
  TU_CHECK(close_to(ar, 2 * r * B, 1e-12) && close_to(rs2, 2 * r * B, 1e-12) &&
               close_to(ag3, 2 * r * (2 * B - emb), 1e-12),
           "ZeRO on 4 ranks, k = 2: stage 0 all-reduce %.0f = 2(D-1)/D B, stage 2 reduce-scatter "
           "%.0f = k (S-1)/S B, stage 3 gathers %.0f = k (S-1)/S (2B - 4|unit 0|)", ar, rs2, ag3);
}

static void test_flops_and_bubble(void) {
  tsr_config c = deck("llm7b");
  const double L = 32, C = 4096, F = 11008, V = 32000, T = 4096;
  const double N = L * (4 * C * C + 3 * C * F) + V * C; /* GEMM weights: layers, the head */
  const double got = tsr_plan_flops_per_token(&c.model);
  TU_CHECK(close_to(got, 6 * N + 6 * L * T * C, 1e-12),
           "llm7b FLOPs per token %.6g = 6 N + 6 L T d = %.6g (N = %.6g weights in GEMMs: not "
           "the embedding lookup, the norms)", got, 6 * N + 6 * L * T * C, N);
  c = deck_on("gpt2_124m", 4);
  const double L2 = 12, C2 = 768, F2 = 3072, V2 = 50304, T2 = 1024;
  const double N2 = L2 * (4 * C2 * C2 + 2 * C2 * F2) + V2 * C2; /* the tied head once */
  const double got2 = tsr_plan_flops_per_token(&c.model);
  TU_CHECK(close_to(got2, 6 * N2 + 6 * L2 * T2 * C2, 1e-12),
           "gpt2_124m FLOPs per token %.6g = 6 N + 6 L T d = %.6g (N = %.6g: the tied "
           "embedding once, as the head; no positions, biases or norms)", got2,
           6 * N2 + 6 * L2 * T2 * C2, N2);
  c = deck("llm70b");
  tsr_hardware hw;
  tsr_plan_grid g;
  tsr_plan p;
  int rc = tsr_plan_hardware(&c.hardware, &hw);
  if (!rc) rc = tsr_plan_layout(&c, 512, 8, &g, NULL, 0);
  if (!rc) rc = tsr_plan_make(&p, &c, &hw, &g, 1);
  /* pp 8, 2 chunks per stage: Megatron's interleaved warm-up keeps 2 (pp - s - 1) + pp + 1
   * chunk activations in flight on stage s (23 on the first, 9 on the last) */
  TU_CHECK(rc == 0 && close_to(p.bubble, 7.0 / 135.0, 1e-12) && p.fits && p.mfu > 0 && p.mfu < 1 &&
               p.stages[0].mem[TSR_PLAN_GPU].in_flight == 23 &&
               p.stages[7].mem[TSR_PLAN_GPU].in_flight == 9,
           "llm70b on 64 x 8 (interleaved, 2 chunks): bubble %.4f = 7/(2 x 64 + 7), stage 0 keeps "
           "%d chunk activations (Megatron: 23), the last %d (9); fits (%.1f GB); predicted step "
           "%.2f s, MFU %.3f", p.bubble, rc ? 0 : p.stages[0].mem[TSR_PLAN_GPU].in_flight,
           rc ? 0 : p.stages[7].mem[TSR_PLAN_GPU].in_flight,
           p.stages[p.worst[TSR_PLAN_GPU]].mem[TSR_PLAN_GPU].total / 1e9, p.t_step, p.mfu);
  tsr_plan_destroy(&p);
}

/* One plan of deck `name` on `world` GPUs (8 per node) with recompute mode `r`; tp and pp
 * as given (0: the deck's). */
static int plan_of(const char *name, int world, int tp, int pp, const char *r, tsr_plan *p) {
  tsr_config c = deck_on(name, world);
  if (tp) c.parallel.tp = tp;
  if (pp) c.parallel.pp = pp;
  c.train.recompute = (tsr_recompute)tu_word("none|selective|full", r);
  tsr_hardware hw;
  tsr_plan_grid g;
  memset(p, 0, sizeof *p);
  int rc = tsr_plan_hardware(&c.hardware, &hw);
  if (!rc) rc = tsr_plan_layout(&c, world, world < 8 ? world : 8, &g, NULL, 0);
  if (!rc) rc = tsr_plan_make(p, &c, &hw, &g, 1);
  return rc;
}

/* Model FLOPs = 3 x forward whatever the recompute mode; executed FLOPs = model FLOPs (no
 * lookup, one head) plus what recomputation runs again: 'selective' only element-wise
 * work (no FLOPs counted), 'full' the forward of every layer (model_layer_recompute: not
 * the head).  All by hand from llm70b's shapes on its own layout (tp 4, pp 8 with 2
 * chunks, 2 of its 8 KV heads per tp rank, so no replicated KV weights). */
static void test_flop_identities(void) {
  const double L = 80, C = 8192, H = 64, KV = 8, hd = 128, F = 28672, V = 32000, T = 4096;
  const double tokens = 1024 * T;
  const double layer = C * (H + 2 * KV) * hd + H * hd * C + 3 * C * F; /* wqkv, wo, MLP */
  const double core = 2 * T * C; /* causal QK^T and PV forward per token and layer */
  const double fwd = 2 * (L * layer + V * C) + L * core, layers_fwd = 2 * L * layer + L * core;
  const char *modes[3] = {"none", "selective", "full"};
  double model[3], exec[3], rec[3];
  int ok = 1;
  for (int i = 0; i < 3; i++) {
    tsr_plan p;
    ok &= plan_of("llm70b", 512, 0, 0, modes[i], &p) == 0;
    model[i] = p.model_flops, exec[i] = p.executed_flops, rec[i] = p.recompute_flops;
    ok &= close_to(p.forward_flops * 3, p.model_flops, 1e-15);
    tsr_plan_destroy(&p);
  }
  TU_CHECK(ok && close_to(model[0], 3 * fwd * tokens, 1e-12) && model[1] == model[0] &&
               model[2] == model[0],
           "llm70b model FLOPs %.6g = 3 x forward by hand %.6g, in every recompute mode (%.6g, "
           "%.6g)", model[0], 3 * fwd * tokens, model[1], model[2]);
  TU_CHECK(close_to(exec[0], model[0], 1e-12) && rec[0] == 0,
           "recompute 'none': executed %.6g = model %.6g (the embedding lookup counted in "
           "neither)", exec[0], model[0]);
  TU_CHECK(close_to(exec[1], exec[0], 1e-12) && rec[1] == 0,
           "recompute 'selective': executed - none = %.6g (rebuilds norm outputs and the MLP "
           "activation only: element-wise)", exec[1] - exec[0]);
  TU_CHECK(close_to(exec[2] - exec[0], layers_fwd * tokens, 1e-9) &&
               close_to(rec[2], layers_fwd * tokens, 1e-12),
           "recompute 'full': executed - none = %.6g = the layers' forward by hand %.6g = model "
           "forward %.6g less the head's %.6g", exec[2] - exec[0], layers_fwd * tokens,
           fwd * tokens, 2 * V * C * tokens);
  /* gpt2 on tp 2 x pp 2: the tied embedding is a lookup on stage 0 and a GEMM (its copy)
   * on the last stage; biases, positions and LayerNorms count none */
  tsr_plan p;
  const int rc = plan_of("gpt2_124m", 4, 2, 2, "none", &p);
  tsr_config c = deck_on("gpt2_124m", 4);
  const double want = tsr_plan_flops_per_token(&c.model) * (double)c.train.global_batch * 1024;
  TU_CHECK(rc == 0 && p.grid.tp == 2 && p.grid.pp == 2 && close_to(p.executed_flops, want, 1e-12) &&
               close_to(p.model_flops, want, 1e-12),
           "gpt2_124m on tp %d x pp %d: executed %.6g = model %.6g = flops per token x tokens "
           "%.6g", p.grid.tp, p.grid.pp, p.executed_flops, p.model_flops, want);
  tsr_plan_destroy(&p);
  /* the same under zb_h1: its W pass computes the fused head's logits again (2 V C per
   * token, over the tp ranks), not the unfused head's */
  for (int fused = 0; fused < 2; fused++) {
    tsr_config z = deck_on("gpt2_124m", 4);
    z.parallel.tp = 2, z.parallel.pp = 2, z.parallel.schedule = TSR_SCHEDULE_ZB_H1;
    z.train.xent_chunk_tokens = fused ? 1024 : 0;
    tsr_hardware hw;
    tsr_plan_grid g;
    memset(&p, 0, sizeof p);
    int zc = tsr_plan_hardware(&z.hardware, &hw);
    if (!zc) zc = tsr_plan_layout(&z, 4, 4, &g, NULL, 0);
    if (!zc) zc = tsr_plan_make(&p, &z, &hw, &g, 1);
    const double head = fused ? 2.0 * 50304 * 768 * (double)z.train.global_batch * 1024 : 0;
    TU_CHECK(zc == 0 && close_to(p.executed_flops - p.model_flops, head, 1e-9) &&
                 close_to(p.model_flops, want, 1e-12),
             "gpt2_124m on tp 2 x pp 2, zb_h1, %s head: executed - model = %.6g (want %.6g)",
             fused ? "fused" : "unfused", p.executed_flops - p.model_flops, head);
    tsr_plan_destroy(&p);
  }
}

/* --max-mem-frac: a layout fits when the GPU's peak plus the reserve is at most the
 * fraction of HBM; just above and just below that point. */
static void test_headroom(void) {
  tsr_config c = deck("llm70b");
  tsr_hardware hw;
  tsr_plan_grid g;
  tsr_plan p;
  int rc = tsr_plan_hardware(&c.hardware, &hw);
  if (!rc) rc = tsr_plan_layout(&c, 512, 8, &g, NULL, 0);
  if (rc || hw.max_mem_frac != 1) {
    TU_CHECK(0, "llm70b on 64 x 8: no plan, or a default headroom other than 1");
    return;
  }
  int fits[3];
  double need = 0;
  for (int i = 0; i < 3; i++) {
    hw.max_mem_frac = i == 0 ? 1 : need / (hw.hbm_gb * 1e9) * (i == 1 ? 1 + 1e-9 : 1 - 1e-9);
    rc |= tsr_plan_make(&p, &c, &hw, &g, 0);
    if (i == 0)
      need = p.stages[p.worst[TSR_PLAN_GPU]].mem[TSR_PLAN_GPU].peak + hw.reserved_gb * 1e9;
    fits[i] = p.fits;
    tsr_plan_destroy(&p);
  }
  TU_CHECK(rc == 0 && fits[0] && fits[1] && !fits[2],
           "llm70b: peak + reserve %.3f GB fits in 80 GB (%d), in %.10f x 80 GB (%d), not in "
           "%.10f x 80 GB (%d)", need / 1e9, fits[0], need / 80e9 * (1 + 1e-9), fits[1],
           need / 80e9 * (1 - 1e-9), fits[2]);
}

/* The search holds the searched keys that the command line names, matched as the deck
 * matches keys (whatever the case, spaces around the name). */
static void test_search_fixed(void) {
  char *over[] = {"parallel.tp=8", " TRAIN.Recompute = full", "model.n_layer=4",
                  "parallel.tpx=1", "train.micro_batch=2", "hardware.gpus_per_node=4"};
  const unsigned got = tsr_plan_search_fixed(6, over);
  const unsigned want = 1u << TSR_PLAN_FIX_TP | 1u << TSR_PLAN_FIX_RECOMPUTE |
                        1u << TSR_PLAN_FIX_MICRO_BATCH;
  TU_CHECK(got == want,
           "overrides of parallel.tp, train.recompute (any case) and train.micro_batch hold "
           "those keys, model.n_layer and hardware keys none: bits %#x (want %#x)", got, want);
}

/* With a flat hardware.compute_efficiency (memory and kernel launches made free), a stage's
 * compute time is its executed FLOPs at that fraction of the datasheet peak of its
 * precision, 989 TFLOP/s bf16 on an H100 and 67 fp32 (no TF32), plus the half forward
 * more that attention's backward costs (priced at 2.5 x its forward, counted at 2 x). */
static void test_compute_peak(void) {
  const char *precision[] = {"bf16", "fp32"};
  const double peak[] = {989e12, 67e12};
  double t[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    tsr_config c = deck("llm7b");
    c.hardware.name = TSR_HW_H100;
    c.hardware.compute_efficiency = 0.6;
    c.hardware.hbm_gbps = 1e12;
    c.hardware.kernel_us = 1e-12;
    c.train.precision = (tsr_dtype)tu_word("fp32|bf16|fp16", precision[i]);
    tsr_hardware hw;
    tsr_plan_grid g;
    tsr_plan p;
    int rc = tsr_plan_hardware(&c.hardware, &hw);
    if (!rc) rc = tsr_plan_layout(&c, 64, 8, &g, NULL, 0);
    if (!rc) rc = tsr_plan_make(&p, &c, &hw, &g, 0);
    if (rc) {
      TU_CHECK(0, "llm7b %s on 8 x 8 H100: no plan", precision[i]);
      continue;
    }
    const tsr_plan_stage *s = &p.stages[0];
    const double tokens = 1024.0 * 4096 / g.dp, L = 32, T = 4096, C = 4096;
    const double attention_fwd = tokens * L * 2 * T * C / g.tp;
    const double want = (s->flops + 0.5 * attention_fwd) / (peak[i] * 0.6);
    TU_CHECK(s->flops > 0 && fabs(s->t_compute - want) <= 1e-6 * want,
             "llm7b %s on 8 x 8 H100: stage compute %.4g s = (%.4g FLOPs + %.4g for attention's "
             "backward) / (%.0f TFLOP/s x 0.6) = %.4g s", precision[i], s->t_compute, s->flops,
             0.5 * attention_fwd, peak[i] / 1e12, want);
    t[i] = s->t_compute;
    tsr_plan_destroy(&p);
  }
  TU_CHECK(close_to(t[1] / t[0], 989.0 / 67.0, 1e-6),
           "fp32 compute takes %.2f x the bf16 time (989 / 67 = %.2f; TF32 would be 2)",
           t[0] > 0 ? t[1] / t[0] : 0, 989.0 / 67.0);
}

/* The share of attention pairs document masking leaves (tsr_plan_doc_attention_share):
 * against its sum over the positions, and a simulated memoryless stream of documents cut
 * into sequences; then what it takes off the plan's FLOPs and compute time. */
static void test_doc_mask(void) {
  tsr_config c = deck("llm7b");
  const double T = (double)c.model.seq_len;
  TU_CHECK(tsr_plan_doc_attention_share(&c) == 1.0, "no document masking: share 1");
  c.data.document_mask = 1;
  TU_CHECK(tsr_plan_doc_attention_share(&c) == 1.0,
           "document masking without data.mean_doc_tokens: share 1 (no saving counted)");
  c.data.mean_doc_tokens = 1;
  TU_CHECK(close_to(tsr_plan_doc_attention_share(&c), 2 / (T + 1), 1e-12),
           "documents of one token: share 2 / (T + 1)");
  const int64_t lens[] = {7, 300, 4096, 100000};
  double prev = 0;
  for (int i = 0; i < 4; i++) {
    c.data.mean_doc_tokens = lens[i];
    const double share = tsr_plan_doc_attention_share(&c), p = 1.0 / (double)lens[i];
    double sum = 0; /* a query at t sees sum_{j <= t} (1 - p)^j keys on average */
    for (int t = 0; t < (int)T; t++) sum += (1 - pow(1 - p, t + 1)) / p;
    /* a stream of documents, each token ending one with probability p, in sequences of T */
    uint64_t rng = 12345;
    double pairs = 0;
    const int seqs = 2000;
    for (int s = 0; s < seqs; s++) {
      int start = 0;
      for (int t = 0; t < (int)T; t++) {
        pairs += t - start + 1;
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        if ((double)(rng >> 11) * (1.0 / 9007199254740992.0) < p) start = t + 1;
      }
    }
    const double sim = pairs / seqs / (T * (T + 1) / 2);
    TU_CHECK(close_to(share, sum / (T * (T + 1) / 2), 1e-9) && close_to(share, sim, 0.03) &&
                 share > prev && share <= 1,
             "documents of %lld tokens on average, T %.0f: share %.5f = the positions' sum "
             "%.5f, a simulated stream %.5f (3%%), growing with the length", (long long)lens[i],
             T, share, sum / (T * (T + 1) / 2), sim);
    prev = share;
  }
  /* the plan: llm7b bf16 on 8 x 8 H100 at a flat efficiency, documents of 512 tokens */
  tsr_plan p[2];
  int made = 0;
  for (int k = 0; k < 2; k++) {
    tsr_config d = deck("llm7b");
    d.hardware.name = TSR_HW_H100;
    d.hardware.compute_efficiency = 0.6;
    d.hardware.hbm_gbps = 1e12;
    d.hardware.kernel_us = 1e-12;
    d.train.precision = TSR_BF16;
    d.data.document_mask = k, d.data.mean_doc_tokens = 512;
    tsr_hardware hw;
    tsr_plan_grid g;
    int rc = tsr_plan_hardware(&d.hardware, &hw);
    if (!rc) rc = tsr_plan_layout(&d, 64, 8, &g, NULL, 0);
    if (!rc) rc = tsr_plan_make(&p[k], &d, &hw, &g, 0);
    made += rc == 0;
    if (k == 1) c = d;
  }
  if (made != 2) {
    TU_CHECK(0, "llm7b with and without document masking: no plan");
    return;
  }
  const double share = tsr_plan_doc_attention_share(&c), saved = p[0].attention_flops * (1 - share);
  const double tokens = 1024.0 * 4096 / p[1].grid.dp, L = 32, C = 4096;
  const double attention_fwd = tokens * L * 2 * T * C / p[1].grid.tp;
  const double dt = (3.5 * attention_fwd * (1 - share)) / (989e12 * 0.6);
  TU_CHECK(close_to(p[1].attention_saved_flops, saved, 1e-12) &&
               close_to(p[1].attention_flops, p[0].attention_flops * share, 1e-12) &&
               close_to(p[1].model_flops, p[0].model_flops - saved, 1e-12) &&
               close_to(p[1].forward_flops * 3, p[1].model_flops, 1e-12) &&
               close_to(tsr_plan_run_flops_per_token(&c) * 1024.0 * 4096, p[1].model_flops,
                        1e-12) &&
               close_to(p[0].stages[0].t_compute - p[1].stages[0].t_compute, dt, 1e-6),
           "llm7b, documents of 512 tokens: share %.4f, attention %.4g of %.4g PFLOP saved, "
           "model FLOPs %.4g -> %.4g PFLOP, stage 0 compute %.4g -> %.4g s (%.4g s less = "
           "3.5 x the forward's saved attention at 989 TFLOP/s x 0.6)", share, saved / 1e15,
           p[0].attention_flops / 1e15, p[0].model_flops / 1e15, p[1].model_flops / 1e15,
           p[0].stages[0].t_compute, p[1].stages[0].t_compute, dt);
  tsr_plan_destroy(&p[0]);
  tsr_plan_destroy(&p[1]);
}

/* ---------------------------------------------------------------- context parallelism */

/* A small llama on tp 2 x cp ranks of one node: 8 query heads (4 per tp rank), 2 KV heads
 * (1 per tp rank), head dimension 16, 3 layers, sequences of 256 tokens, micro_batch 2,
 * 2 micro-batches per step on dp 1 (global_batch 4 x dp), ZeRO 0. */
enum { CP_L = 3, CP_B = 2, CP_T = 256, CP_H = 4, CP_KV = 1, CP_HD = 16 };
static tsr_config cp_deck(int cp, tsr_cp_comm comm, tsr_dtype precision, tsr_recompute r, int dp) {
  tsr_config c;
  tsr_deck_defaults(&c);
  c.model.n_layer = CP_L, c.model.d_model = 128, c.model.n_head = 8, c.model.n_kv_head = 2;
  c.model.d_ff = 352, c.model.vocab_size = 256, c.model.seq_len = CP_T;
  c.parallel.tp = 2, c.parallel.cp = cp, c.parallel.cp_comm = comm;
  c.parallel.zero_stage = 0, c.parallel.sequence_parallel = 0;
  c.train.micro_batch = CP_B, c.train.global_batch = 2 * CP_B * dp;
  c.train.precision = precision, c.train.recompute = r;
  return c;
}
static int cp_grid(const tsr_config *c, int dp, tsr_plan_grid *g) {
  const int world = (int)(c->parallel.tp * c->parallel.cp) * dp;
  char msg[1024] = "";
  const int n = tsr_plan_layout(c, world, world, g, msg, sizeof msg);
  if (n) printf("    %s", msg);
  return n;
}

static void test_cp_grid(void) {
  tsr_config c = deck_on("llm7b", 64);
  tsr_plan_grid g;
  c.parallel.tp = 4, c.parallel.cp = 4;
  int n = tsr_plan_layout(&c, 64, 8, &g, NULL, 0);
  TU_CHECK(n == 0 && g.cp == 4 && g.dp == 4 && g.dpcp == 16 && g.shard == 16 && g.replicate == 1 &&
               g.micro_batches == 1024 / 4,
           "tp 4 x cp 4 on 64 GPUs: dp %d (world / (tp cp pp)), dp x cp %d, ZeRO over %d x %d "
           "copies, %d micro-batches per dp rank", g.dp, g.dpcp, g.shard, g.replicate,
           g.micro_batches);
  c.parallel.shard_scope = TSR_SHARD_NODE;
  n = tsr_plan_layout(&c, 64, 8, &g, NULL, 0);
  TU_CHECK(n == 0 && g.shard == 2 && g.replicate == 8,
           "  ... shard_scope 'node': the 2 dp x cp ranks of a tp rank on a node of 8 shard, "
           "8 copies (%d x %d)", g.shard, g.replicate);
  tsr_model_sizes d;
  tsr_config k = cp_deck(4, TSR_CP_P2P, TSR_BF16, TSR_RECOMPUTE_NONE, 1);
  tsr_plan_model_sizes(&k, 2, 4, 1, 1, CP_L, &d);
  TU_CHECK(d.T == CP_T / 4 && d.N == CP_B * CP_T / 4 && d.H == CP_H && d.KV == CP_KV,
           "the model's sizes for a cp rank of 4: T %lld = 256 / 4, N %lld", (long long)d.T,
           (long long)d.N);
}

/* Memory of a cp rank: activations 1/cp of cp 1's to the byte; the ring's buffers and the
 * all-to-alls' as docs/context_parallel.md "What the planner counts" gives them. */
static void test_cp_memory(void) {
  const int cp = 4;
  const double N = CP_B * CP_T / cp, hd = CP_HD, H = CP_H, KV = CP_KV;
  for (int half = 0; half < 2; half++) {
    const tsr_dtype dt = half ? TSR_BF16 : TSR_F32;
    const double e = half ? 2 : 4;
    tsr_plan_memory m1, mp, ma, md;
    tsr_plan_grid g;
    tsr_config c1 = cp_deck(1, TSR_CP_P2P, dt, TSR_RECOMPUTE_SELECTIVE, 1);
    tsr_config cd = cp_deck(1, TSR_CP_P2P, dt, TSR_RECOMPUTE_SELECTIVE, cp);
    tsr_config cpp = cp_deck(cp, TSR_CP_P2P, dt, TSR_RECOMPUTE_SELECTIVE, 1);
    tsr_config ca = cp_deck(cp, TSR_CP_A2A, dt, TSR_RECOMPUTE_SELECTIVE, 1);
    int rc = cp_grid(&c1, 1, &g) || tsr_plan_stage_memory(&c1, &g, 0, TSR_PLAN_GPU, &m1);
    rc |= cp_grid(&cpp, 1, &g) || tsr_plan_stage_memory(&cpp, &g, 0, TSR_PLAN_GPU, &mp);
    rc |= cp_grid(&ca, 1, &g) || tsr_plan_stage_memory(&ca, &g, 0, TSR_PLAN_GPU, &ma);
    rc |= cp_grid(&cd, cp, &g) || tsr_plan_stage_memory(&cd, &g, 0, TSR_PLAN_GPU, &md);
    if (rc) {
      TU_CHECK(0, "cp memory: no plan");
      return;
    }
    /* the model's exchange buffers (model_sizes.c; docs/context_parallel.md "What the
     * planner counts"): ring, two K|V blocks and a strided-copy scratch in the storage
     * type; fp32 sums of the output, one chunk's partial output and lse, two dK|dV blocks.
     * a2a (one KV head < cp: replicated), whole sequences of H/cp heads: q|k|v and its
     * gradient, send and receive blocks, out and dout; fp32 sums of the KV gradients */
    const double kvd = KV * hd, qd = H * hd, Hc = H / cp, W = (Hc + 2) * hd, Nf = N * cp;
    const double ring = (2 * N * 2 * kvd + N * (qd > 2 * kvd ? qd : 2 * kvd)) * e;
    const double ring32 = (N * qd + N / 2 * qd + CP_B * H * (CP_T / cp / 2) + 2 * N * 2 * kvd) * 4;
    const double a2a = (4 * Nf * W + 2 * Nf * Hc * hd) * e, a2a32 = (KV + 1) * N * 2 * hd * 4;
    TU_CHECK(mp.activations == m1.activations / cp + N * 4 && ma.activations == mp.activations &&
                 mp.params == md.params && mp.grads == md.grads && mp.optim == md.optim,
             "%s: a cp rank of %d holds %.0f bytes of activations = cp 1's %.0f / %d and its "
             "rows' position offsets (N int32) exactly; parameters, gradients and Adam as on "
             "dp %d without cp (ZeRO's padding over dp x cp)", half ? "bf16" : "fp32", cp,
             mp.activations, m1.activations, cp, cp);
    TU_CHECK(m1.comm == 0 && mp.comm == ring && ma.comm == a2a,
             "  ... buffers: the ring's two K|V blocks and copy scratch = %.0f (planned %.0f); "
             "the all-to-alls' whole sequences on H/cp heads and one KV head = %.0f (planned "
             "%.0f)", ring, mp.comm, a2a, ma.comm);
    if (!half)
      TU_CHECK(mp.workspace - ma.workspace == ring32 - a2a32,
               "  ... the fp32 sums: the ring's %.0f, the all-to-alls' %.0f: %.0f more "
               "(planned %.0f)", ring32, a2a32, ring32 - a2a32, mp.workspace - ma.workspace);
  }
}

/* Rank traffic of group grp, kind k, stage 0, for a cp deck on dp ranks. */
static double cp_traffic_of(const tsr_config *c, int dp, int grp, tsr_comm_kind k,
                            tsr_plan_traffic *all) {
  tsr_plan_grid g;
  tsr_plan_traffic t[TSR_PLAN_N_GROUPS];
  if (cp_grid(c, dp, &g) || tsr_plan_stage_traffic(c, &g, 0, t)) return -1;
  if (all) *all = t[grp];
  return t[grp].bytes[k];
}

/* The cp group's bytes per step by the formulas, counted by hand per layer and micro-batch:
 * the ring sends (and receives) its K and V cp - 1 times forward and backward and the fp32
 * dK, dV cp times; the all-to-alls move (cp - 1) / cp of q, k, v, out forward and of q, k,
 * v, out, dout, dq, dk, dv backward; 'full' recompute the forward's again.  The gradient
 * reduction runs over dp x cp. */
static void test_cp_traffic(void) {
  const double k = 2, L = CP_L;
  for (int cp = 2; cp <= 4; cp *= 2) {
    const double N = CP_B * CP_T / cp, hd = CP_HD, Hc = (double)CP_H / cp, KVc = 1;
    for (int full = 0; full < 2; full++) {
      const tsr_recompute r = full ? TSR_RECOMPUTE_FULL : TSR_RECOMPUTE_NONE;
      tsr_config c = cp_deck(cp, TSR_CP_P2P, TSR_BF16, r, 1);
      tsr_plan_traffic t;
      const double send = cp_traffic_of(&c, 1, TSR_PLAN_CP, TSR_COMM_SEND, &t);
      const double recv = t.bytes[TSR_COMM_RECV];
      const double kv = 2 * N * CP_KV * hd;
      const double want = k * L * (((1 + full) * (cp - 1) * kv + (cp - 1) * kv) * 2 + cp * kv * 4);
      TU_CHECK(send == want && recv == want && t.total == 2 * want && t.size == cp &&
                   !strcmp(t.name, "cp"),
               "cp %d ring, recompute %s: sends %.0f = receives %.0f = k L ((%d x (cp-1) + "
               "(cp-1)) 2 N KV hd x 2 + cp 2 N KV hd x 4) = %.0f bytes", cp,
               full ? "full" : "none", send, recv, 1 + full, want);
      c = cp_deck(cp, TSR_CP_A2A, TSR_BF16, r, 1);
      const double a2a = cp_traffic_of(&c, 1, TSR_PLAN_CP, TSR_COMM_ALL_TO_ALL, &t);
      const double want_a = k * L * (cp - 1) * N * hd * 2 *
                            ((1 + full) * (2 * Hc + 2 * KVc) + 4 * Hc + 4 * KVc);
      TU_CHECK(a2a == want_a && t.total == want_a,
               "cp %d all-to-alls, recompute %s: %.0f = k L (cp-1) N hd 2 (%d x (2 H/cp + 2) + "
               "4 H/cp + 4) = %.0f bytes", cp, full ? "full" : "none", a2a, 1 + full, want_a);
    }
  }
  /* the gradient: all-reduced over dp x cp = 4 ranks, as over dp 4 without cp */
  tsr_config c = cp_deck(4, TSR_CP_P2P, TSR_BF16, TSR_RECOMPUTE_NONE, 1);
  tsr_plan_traffic t;
  const double with = cp_traffic_of(&c, 1, TSR_PLAN_DP, TSR_COMM_ALL_REDUCE, &t);
  tsr_config d = cp_deck(1, TSR_CP_P2P, TSR_BF16, TSR_RECOMPUTE_NONE, 4);
  const double without = cp_traffic_of(&d, 4, TSR_PLAN_DP, TSR_COMM_ALL_REDUCE, NULL);
  TU_CHECK(with > 0 && with == without && t.size == 4 && !strcmp(t.name, "dp_cp"),
           "cp 4 on dp 1: the gradient all-reduce over dp x cp ('%s', %d ranks) moves %.0f "
           "bytes, as dp 4 without cp (%.0f)", t.name, t.size, with, without);
}

/* FLOPs and time: the same model FLOPs, 1/cp per GPU; with a flat efficiency (kernels and
 * memory made free) the ring's blocks and the head-split attention take 1/cp of the whole
 * causal attention's time; the ring's hops hide behind a step's attention on a fast link,
 * and on a slow one each of the cp - 1 forward hops is exposed by what it takes beyond a
 * step. */
static int cp_plan(tsr_config *c, int dp, double gbps, tsr_plan *p, tsr_plan_chunk *ch,
                   tsr_hardware *hw) {
  c->hardware.name = TSR_HW_H100;
  c->hardware.compute_efficiency = 0.5, c->hardware.comm_efficiency = 1;
  c->hardware.hbm_gbps = 1e12, c->hardware.kernel_us = 1e-12;
  c->hardware.intra_node_gbps = gbps, c->hardware.intra_node_latency_us = 1e-12;
  tsr_plan_grid g;
  memset(p, 0, sizeof *p);
  int rc = tsr_plan_hardware(&c->hardware, hw);
  if (!rc) rc = cp_grid(c, dp, &g);
  if (!rc) rc = tsr_plan_make(p, c, hw, &g, 1);
  if (!rc) rc = tsr_plan_chunk_cost(c, hw, &g, 0, ch);
  return rc;
}

static void test_cp_time(void) {
  const int cp = 4;
  tsr_plan p1, pr, pa, slow;
  tsr_plan_chunk c1, cr, ca, cs;
  tsr_hardware hw;
  tsr_config d1 = cp_deck(1, TSR_CP_P2P, TSR_BF16, TSR_RECOMPUTE_NONE, 1);
  tsr_config dr = cp_deck(cp, TSR_CP_P2P, TSR_BF16, TSR_RECOMPUTE_NONE, 1);
  tsr_config da = cp_deck(cp, TSR_CP_A2A, TSR_BF16, TSR_RECOMPUTE_NONE, 1);
  tsr_config ds = dr;
  int rc = cp_plan(&d1, 1, 450, &p1, &c1, &hw) | cp_plan(&dr, 1, 1e9, &pr, &cr, &hw) |
           cp_plan(&da, 1, 450, &pa, &ca, &hw) | cp_plan(&ds, 1, 1e-4, &slow, &cs, &hw);
  if (!rc) {
    TU_CHECK(pr.model_flops == p1.model_flops && close_to(pr.stages[0].flops * cp, p1.stages[0].flops, 1e-12) &&
                 close_to(pr.executed_flops, pr.model_flops, 1e-12),
             "cp %d: model FLOPs %.6g as cp 1's; a GPU executes %.6g = cp 1's / cp (%.6g); all "
             "GPUs the model FLOPs", cp, pr.model_flops, pr.stages[0].flops, p1.stages[0].flops);
    TU_CHECK(close_to(cr.attention * cp, c1.attention, 1e-9) &&
                 close_to(ca.attention * cp, c1.attention, 1e-9),
             "  ... attention %.6g s on a ring rank (4 cp Tc-triangles), %.6g s on a head "
             "split (H/cp heads over T) = cp 1's %.6g s / cp", cr.attention, ca.attention,
             c1.attention);
    TU_CHECK(cr.f_cp == 0 && cr.b_cp < 1e-6 * cr.attention && ca.f_cp > 0 && ca.b_cp > ca.f_cp,
             "  ... on a fast link the ring's hops hide behind its blocks (forward %.3g s, "
             "backward %.3g s: the dK, dV's last hop); the all-to-alls are not hidden (%.3g s, "
             "%.3g s)", cr.f_cp, cr.b_cp, ca.f_cp, ca.b_cp);
    /* the slow link: the forward's cp - 1 hops of K and V (bf16), each beyond a step */
    const double N = CP_B * CP_T / cp, Tc = CP_T / cp / 2.0, k = hw.prof.kernel_s;
    const double att = 4 * cp * (tsr_plan_attention_s(&hw, 1, 0, CP_B, CP_H, Tc, CP_HD) - k) +
                       (2 * cp + 1) * k;
    const double hop = tsr_plan_link_s(&hw, TSR_LINK_INTRA, 2 * N * CP_KV * CP_HD * 2, 1);
    const double want = CP_L * (cp - 1) * (hop - att / cp);
    TU_CHECK(hop > att && close_to(cs.f_cp, want, 1e-9) && slow.t_step > pr.t_step,
             "  ... on a slow link the forward exposes L (cp-1) (hop - attention / cp) = %.6g s "
             "(planned %.6g), and the step is longer (%.4g s against %.4g)", want, cs.f_cp,
             slow.t_step, pr.t_step);
  } else {
    TU_CHECK(0, "cp time: no plan");
  }
  tsr_plan_destroy(&p1), tsr_plan_destroy(&pr), tsr_plan_destroy(&pa), tsr_plan_destroy(&slow);
}

/* input/llama3_8b_128k.nml: its own layout (tp 4 x cp 4 x dp 4) fits on 8 nodes of 8
 * H100s; without cp no tp of a node fits, even with ZeRO 3 and full recompute. */
static void test_cp_deck(void) {
  tsr_config c = deck_on("llama3_8b_128k", 64);
  tsr_hardware hw;
  tsr_plan_grid g;
  tsr_plan p;
  double mem[3] = {0, 0, 0};
  int fits[3] = {0, 0, 0}, rc = tsr_plan_hardware(&c.hardware, &hw);
  for (int i = 0; i < 3 && !rc; i++) {
    tsr_config d = c;
    if (i > 0) d.parallel.cp = 1, d.parallel.tp = i == 1 ? 4 : 8;
    if (i == 2) d.parallel.zero_stage = 3, d.train.recompute = TSR_RECOMPUTE_FULL;
    rc = tsr_plan_layout(&d, 64, 8, &g, NULL, 0);
    if (!rc) rc = tsr_plan_make(&p, &d, &hw, &g, 0);
    if (!rc) {
      mem[i] = p.stages[p.worst[TSR_PLAN_GPU]].mem[TSR_PLAN_GPU].peak / 1e9;
      fits[i] = p.fits;
    }
    tsr_plan_destroy(&p);
  }
  TU_CHECK(rc == 0 && c.model.seq_len == 131072 && c.parallel.cp == 4 && fits[0] && !fits[1] &&
               !fits[2],
           "llama3_8b_128k on 8 x 8 H100: tp 4 x cp 4 x dp 4 fits (%.1f GB); cp 1 does not at "
           "tp 4 (%.1f GB) nor at tp 8 with ZeRO 3 and full recompute (%.1f GB)", mem[0], mem[1],
           mem[2]);
}

/* The deck `name` on `world` GPUs of `rpn` a node with the layout keys given (tp x pp = the
 * deck's, sp off unless tp > 1), offload fraction f (0: none), precision. */
static int offload_plan(const char *name, int world, int rpn, int tp, int zero, int half,
                        double f, tsr_plan *p, tsr_config *out) {
  tsr_config c = deck(name); /* its own layout checked on 512 ranks, replaced below */
  c.parallel.tp = tp, c.parallel.pp = 1, c.parallel.virtual_stages = 1;
  c.parallel.schedule = TSR_SCHEDULE_1F1B;
  c.parallel.sequence_parallel = tp > 1;
  c.parallel.zero_stage = zero;
  c.parallel.offload = f > 0 ? TSR_OFFLOAD_OPTIMIZER : TSR_OFFLOAD_NONE;
  c.parallel.offload_fraction = f > 0 ? f : 1;
  c.train.precision = half ? TSR_BF16 : TSR_F32;
  c.train.micro_batch = 1, c.train.recompute = TSR_RECOMPUTE_FULL;
  c.hardware.gpus_per_node = rpn;
  tsr_hardware hw;
  tsr_plan_grid g;
  memset(p, 0, sizeof *p);
  int rc = tsr_plan_hardware(&c.hardware, &hw);
  if (!rc) rc = tsr_plan_layout(&c, world, rpn, &g, NULL, 0);
  if (!rc) rc = tsr_plan_make(p, &c, &hw, &g, 1);
  if (out) *out = c;
  return rc;
}

static void test_offload_state(void) {
  const double N = 7e9, GB = 1e9;
  for (int half = 0; half < 2; half++)
    for (int z = 1; z <= 3; z += 2) {
      const tsr_plan_memory a = tsr_plan_state(N, z, 4, half, 0);
      const tsr_plan_memory b = tsr_plan_state(N, z, 4, half, 1);
      const double own = N / 4, off = half ? 12 : 8, host = half ? 18 : 16;
      TU_CHECK(b.master == 0 && b.optim == 0 && b.params == a.params && b.grads == a.grads &&
                   a.total - b.total == off * own && b.host_master == 4 * own &&
                   b.host_optim == 8 * own && b.host_grads == 4 * own &&
                   b.host_staging == (half ? 2 * own : 0) && b.host == host * own && a.host == 0,
               "7B %s ZeRO-%d on 4 GPUs, offloaded: the device holds %.2f GB less (%.0f B a "
               "parameter of the shard), the host %.2f GB (%.0f B: master 4, m and v 8, "
               "gradient 4%s)", half ? "bf16" : "fp32", z, (a.total - b.total) / GB, off,
               b.host / GB, host, half ? ", staging 2" : "");
    }
  const tsr_plan_memory h = tsr_plan_state(N, 3, 4, 1, 0.5), a = tsr_plan_state(N, 3, 4, 1, 0);
  TU_CHECK(h.master == a.master / 2 && h.optim == a.optim / 2 && h.host == 9 * N / 4,
           "half the shard offloaded: half its master and moments on the device, 9 B a "
           "parameter of the shard on the host");
}

/* Chunk 0's cost with the offload (b) and without (a) at hardware.pcie_gbps = pcie (0: the
 * H100's), and the plan with it (p, destroyed by the caller); 0 or an error. */
static int act_chunks(tsr_config c, const tsr_plan_grid *g, double pcie, tsr_plan_chunk *a,
                      tsr_plan_chunk *b, tsr_plan *p) {
  c.hardware.pcie_gbps = pcie;
  tsr_hardware hw;
  memset(p, 0, sizeof *p);
  int rc = tsr_plan_hardware(&c.hardware, &hw) || tsr_plan_chunk_cost(&c, &hw, g, 0, b) ||
           tsr_plan_make(p, &c, &hw, g, 1);
  c.train.activation_offload = 0;
  return rc || tsr_plan_chunk_cost(&c, &hw, g, 0, a);
}

/* The activation offload's PCIe time for deck c (train.activation_offload on) on grid g,
 * `block` bytes a layer counted by hand: chunk 0's forward and backward against the same
 * without the offload, on the H100's 50 GB/s (a block of a few kB: hidden) and at
 * hardware.pcie_gbps = 0.001 (1 MB/s: a block takes longer than a layer's compute), each
 * f + L max(0, block / pcie - f / L); and the stage's blocks over a step, m L each way. */
static void act_offload_time(const tsr_config *on, const tsr_plan_grid *g, double block,
                             double stash) {
  for (int slow = 0; slow < 2; slow++) {
    tsr_plan_chunk a, b;
    tsr_plan p;
    const int rc = act_chunks(*on, g, slow ? 0.001 : 0, &a, &b, &p);
    const double L = a.layers, copy = block / (slow ? 1e6 : 50e9);
    const double f = a.f + L * fmax(0, copy - a.f / L), bw = a.b + L * fmax(0, copy - a.b / L);
    TU_CHECK(rc == 0 && close_to(b.f, f, 1e-12) && close_to(b.b, bw, 1e-12) &&
                 (slow ? b.f > a.f && b.b > a.b : b.f == a.f && b.b == a.b) &&
                 close_to(b.act_exposed, f - a.f + bw - a.b, 1e-9) &&
                 p.stages[0].act_bytes == g->micro_batches * L * block,
             "  ... PCIe at %s: a block of %.0f bytes a layer in %.4g us; chunk 0 (%.0f layers) "
             "forward %.4g -> %.4g us, backward %.4g -> %.4g us; %d micro-batches move %.0f "
             "bytes each way", slow ? "1 MB/s" : "50 GB/s", block, copy * 1e6, L, a.f * 1e6,
             b.f * 1e6, a.b * 1e6, b.b * 1e6, g->micro_batches, p.stages[0].act_bytes);
    tsr_plan_destroy(&p);
  }
  /* ZB-H1 (recompute none): each block also holds B's stash for W (`stash` bytes); B sends
   * it to the host after the layer and loads the next one on the same queue, b + L max(0,
   * 2 block / pcie - b / L), and the W pass brings it back once more, w + L max(0, block /
   * pcie - w / L); twice the blocks go each way */
  if (on->train.recompute != TSR_RECOMPUTE_NONE) return;
  tsr_config c = *on;
  c.parallel.schedule = TSR_SCHEDULE_ZB_H1;
  tsr_plan_chunk a, b;
  tsr_plan p;
  const int rc = act_chunks(c, g, 0.001, &a, &b, &p);
  const double L = a.layers, zb = block + stash, copy = zb / 1e6;
  const double f = a.f + L * fmax(0, copy - a.f / L);
  const double bw = a.b + L * fmax(0, 2 * copy - a.b / L), w = a.w + L * fmax(0, copy - a.w / L);
  const double moved = 2.0 * g->micro_batches * L * zb;
  TU_CHECK(rc == 0 && a.w > 0 && b.act_block == zb && close_to(b.f, f, 1e-12) &&
               close_to(b.b, bw, 1e-12) && close_to(b.w, w, 1e-12) && b.w > a.w &&
               close_to(b.act_exposed, f - a.f + bw - a.b + w - a.w, 1e-9) &&
               p.stages[0].act_bytes == moved && p.stages[0].act_back == moved,
           "  ... ZB-H1 at 1 MB/s: a block of %.0f bytes with B's stash (%.0f); B %.4g -> %.4g "
           "us (each block back to the host too), W %.4g -> %.4g us (each block back a second "
           "time); %.0f bytes each way", zb, stash, a.b * 1e6, b.b * 1e6, a.w * 1e6, b.w * 1e6,
           p.stages[0].act_bytes);
  tsr_plan_destroy(&p);
}

/* train.activation_offload: stage 0 of a llama of 4 layers on pp 2 (1F1B, 2 layers a
 * stage), d_model 64, 4 heads of 16 (2 KV heads), d_ff 160, micro-batches of 2 x 32 tokens,
 * in bf16 and fp32 and every recompute mode.  By hand: a layer's stored set (norm outputs,
 * qkv, attention out, h, fc, act in the storage type; lse and four norm statistics in fp32:
 * the groups the mode keeps), a row of the residual stream, and the block (each buffer of
 * set and row rounded up to 256 bytes).  The GPU column's activations drop by s slots x
 * (L sets + L rows) and gain the window's 2 blocks; the host column gains s x L blocks; the
 * CPU column is unchanged. */
static void test_activation_offload(void) {
  for (int half = 0; half < 2; half++)
    for (int r = 0; r < 3; r++) {
      tsr_config c;
      tsr_deck_defaults(&c);
      c.model.arch = TSR_ARCH_LLAMA;
      c.model.n_layer = 4, c.model.d_model = 64, c.model.n_head = 4, c.model.n_kv_head = 2;
      c.model.d_ff = 160, c.model.vocab_size = 300, c.model.seq_len = 32;
      c.parallel.pp = 2, c.parallel.schedule = TSR_SCHEDULE_1F1B;
      c.train.micro_batch = 2, c.train.global_batch = 8;
      c.train.recompute = (tsr_recompute)r;
      c.train.precision = half ? TSR_BF16 : TSR_F32;
      tsr_plan_grid g;
      tsr_plan_memory g0, g1, c0, c1;
      int rc = tsr_plan_layout(&c, 2, 2, &g, NULL, 0) ||
               tsr_plan_stage_memory(&c, &g, 0, TSR_PLAN_GPU, &g0) ||
               tsr_plan_stage_memory(&c, &g, 0, TSR_PLAN_CPU, &c0);
      c.train.activation_offload = 1;
      rc = rc || tsr_plan_stage_memory(&c, &g, 0, TSR_PLAN_GPU, &g1) ||
           tsr_plan_stage_memory(&c, &g, 0, TSR_PLAN_CPU, &c1);
      if (rc) {
        TU_CHECK(0, "activation offload: no plan");
        continue;
      }
      const double e = half ? 2 : 4, N = 64, C = 64, hd = 16, F = 160, L = 2, s = g1.in_flight;
      const double dt[7] = {N * C, N * C, N * (4 + 2 * 2) * hd, N * 4 * hd, N * C, N * 2 * F,
                            N * F}; /* norm1 norm2 qkv atty h fc act */
      const double f32[5] = {2 * 4 * 32, N, N, N, N};
      double set = 0, block = 0;
      for (int i = 0; i < 7; i++) {
        const int kept = r == 0 || (r == 1 && i >= 2 && i <= 5);
        if (kept) set += dt[i] * e, block += ceil(dt[i] * e / 256) * 256;
      }
      for (int i = 0; i < 5 && r < 2; i++) set += f32[i] * 4, block += ceil(f32[i] * 4 / 256) * 256;
      const double row = N * C * e;
      block += ceil(row / 256) * 256;
      const char *mode[3] = {"none", "selective", "full"};
      TU_CHECK(g0.activations - g1.activations == s * L * (set + row) - 2 * block &&
                   g1.host_acts == s * L * block && g1.host - g0.host == g1.host_acts &&
                   g0.host_acts == 0 && c1.activations == c0.activations &&
                   c1.total == c0.total && c1.host == 0 && g1.in_flight == g0.in_flight,
               "%s, recompute %s, stage 0 of pp 2 (%.0f slots x %.0f layers): the GPU keeps "
               "%.0f bytes fewer activations (slots x layers x (set %.0f + row %.0f) less 2 "
               "blocks of %.0f), the host %.0f (planned %.0f, %.0f); the CPU column is "
               "unchanged", half ? "bf16" : "fp32", mode[r], s, L,
               g0.activations - g1.activations, set, row, block, s * L * block, g1.host_acts,
               g1.host - g0.host);
      /* B's stash for W (split backward): d_down and d_o [N, C], d_fc [N, 2F], d_qkv
       * [N, (H + 2 KV) hd] in the storage type, the norms' w and b [2C] each in fp32 */
      const double r256[6] = {N * C * e, N * C * e, N * 2 * F * e, N * 8 * hd * e, 2 * C * 4,
                              2 * C * 4};
      double stash = 0;
      for (int i = 0; i < 6; i++) stash += ceil(r256[i] / 256) * 256;
      act_offload_time(&c, &g, block, stash);
    }
}

/* The update the step pays, by hand (docs/offload.md "What the planner counts"): the
 * copies and the CPU's AdamW of `own` elements at 50 GB/s and 49.25 GB/s, in pieces of 2^21
 * elements; ZeRO 0-1 pipelines all three (the slowest plus one piece of each other); ZeRO
 * 2-3 leave the last of `units` units' copy to the host, then the CPU's AdamW and the copy
 * back pipelined; ZeRO-3 hides that behind the next first forward `ff`. */
static double update_by_hand(int z, int half, double own, int units, double ff, double *last) {
  const double e = half ? 2 : 4, rate = fmin(11.5 * 112, 394.0) / 8 * 1e9;
  const double d2h = 4 * own / 50e9, h2d = e * own / 50e9, cpu = (half ? 30 : 28) * own / rate;
  const double share = fmin(2097152, own) / own;
  *last = 0;
  if (z < 2) { /* the slowest of the three: the CPU's, at these rates */
    const double slow = fmax(cpu, fmax(d2h, h2d));
    return fmax(0, slow + (d2h + cpu + h2d - slow) * share - ff);
  }
  *last = d2h / units;
  const double two = fmax(cpu, h2d) + fmin(cpu, h2d) * share;
  return *last + fmax(0, two - ff);
}

/* The llm7b deck's stage memory and its offloaded update, against zero.c's buffers of the
 * padded shard (tsr_zero_padded_length) and the hardware's figures, by hand. */
static void test_offload_plan(void) {
  for (int half = 0; half < 2; half++)
    for (int z = 1; z <= 3; z++) {
      tsr_plan p0, p1;
      tsr_config c;
      const int r0 = offload_plan("llm7b", 8, 8, 1, z, half, 0, &p0, NULL);
      const int r1 = offload_plan("llm7b", 8, 8, 1, z, half, 1, &p1, &c);
      if (r0 || r1) {
        TU_CHECK(0, "llm7b on 1 x 8: no plan (%d, %d)", r0, r1);
        tsr_plan_destroy(&p0), tsr_plan_destroy(&p1);
        continue;
      }
      const double n = (double)tsr_zero_padded_length(p1.n_params, 8), own = n / 8;
      const double e = half ? 2 : 4;
      const tsr_plan_memory *g0 = &p0.stages[0].mem[TSR_PLAN_GPU];
      const tsr_plan_memory *g1 = &p1.stages[0].mem[TSR_PLAN_GPU];
      const tsr_plan_memory *c0 = &p0.stages[0].mem[TSR_PLAN_CPU];
      const tsr_plan_memory *c1 = &p1.stages[0].mem[TSR_PLAN_CPU];
      /* ZeRO-3: the gradient shard and its landing area (8 B) leave the device too, for
       * three landing areas of the largest unit piece (zero.c's host_grads), each with its
       * host copy */
      const double piece =
          z >= 2 ? (g1->host - (half ? 18 : 16) * own) / (4.0 * TSR_ZERO_GRAD_SLOTS) : 0;
      TU_CHECK(g0->total - g1->total == (half ? 12 : 8) * own + (z >= 2 ? 8 * own - 12 * piece : 0) &&
                   (z >= 2 ? piece > 0 && piece < own && g1->grads == 0 : piece == 0) &&
                   c1->total == c0->total && c1->host == 0 && p1.host_node == 8 * g1->host,
               "llm7b %s ZeRO-%d on 8 GPUs: device %.3f -> %.3f GB (%.0f B x %.6g own%s), host "
               "%.3f GB a GPU = %.0f B x own%s, %.2f GB a node; this CPU build's column the same",
               half ? "bf16" : "fp32", z, g0->total / 1e9, g1->total / 1e9, half ? 12.0 : 8.0,
               own, z >= 2 ? " + 8 B x own - 12 B x the largest unit piece" : "", g1->host / 1e9,
               half ? 18.0 : 16.0, z >= 2 ? " + 4 B x 3 slots x the piece" : "", p1.host_node / 1e9);
      /* the update's copies and the CPU's AdamW */
      const tsr_plan_offload *o = &p1.stages[0].offload;
      const double cpu_rate = fmin(11.5 * 112, 394.0) / 8 * 1e9; /* h100 node: 49.25 GB/s */
      TU_CHECK(o->fraction == 1 && o->d2h_bytes == 4 * own && o->h2d_bytes == e * own &&
                   o->cpu_bytes == (half ? 30 : 28) * own &&
                   close_to(o->d2h_s, 4 * own / 50e9, 1e-12) &&
                   close_to(o->h2d_s, e * own / 50e9, 1e-12) &&
                   close_to(o->cpu_s, (half ? 30 : 28) * own / cpu_rate, 1e-12) &&
                   o->serial_s == o->d2h_s + o->cpu_s + o->h2d_s,
               "  ... PCIe: %.4g GB to the host, %.4g back (4 and %.0f B a parameter of the "
               "shard) at 50 GB/s: %.4g s, %.4g s; CPU AdamW %.4g GB (%d B) at %.4g GB/s a "
               "GPU (112 cores x 11.5 GB/s, at most 394 / 8): %.4g s", o->d2h_bytes / 1e9,
               o->h2d_bytes / 1e9, e, o->d2h_s, o->h2d_s, o->cpu_bytes / 1e9, half ? 30 : 28,
               cpu_rate / 1e9, o->cpu_s);
      /* the step: the device's AdamW replaced by the offloaded update (ZeRO-1: the three
       * pipelined; ZeRO 2-3: the gradient on the host already), behind the next first
       * forward, each by hand from the rates; llm7b's 32 layers, the embedding and the
       * head are 34 units */
      tsr_hardware hw;
      tsr_plan_hardware(&c.hardware, &hw);
      const double ownu = (double)p1.n_params / 8, ff = p1.sim.f, back = p1.sim.b + p1.sim.w;
      double last;
      const double pays = update_by_hand(z, half, ownu, 34, ff, &last);
      const double adam = tsr_plan_stream_s(&hw, ownu * (28 + e));
      const tsr_plan_update_case want[] = {
          TSR_PLAN_UPDATE_DEVICE_GRADS, TSR_PLAN_UPDATE_DEVICE_GRADS, TSR_PLAN_UPDATE_HOST_GRADS,
          TSR_PLAN_UPDATE_HOST_GRADS};
      const char *what[] = {"", "the three pipelined behind the next first forward",
                            "the gradient on the host, behind the next first forward",
                            "the gradient on the host, behind the next first forward"};
      /* ZeRO 2-3: the host's gradient work beside it, the norm's pass (4 B an element) and
       * the micro-batches' additions (12 B) where they outlast the micro-batch */
      const int m = p1.grid.micro_batches;
      const double hostw = z < 2 ? 0 : 4 * ownu / cpu_rate +
                                       m * fmax(0, 12 * ownu / cpu_rate - (ff + back));
      TU_CHECK(close_to(p1.t_step - p0.t_step, pays + hostw - adam, 1e-6) &&
                   (z < 2 ? o->host_norm_s == 0 && o->accum_s == 0
                          : close_to(o->host_norm_s, 4 * own / cpu_rate, 1e-9) &&
                                close_to(o->accum_s, 12 * own / cpu_rate, 1e-9)) &&
                   close_to(p1.sim.offload, pays, 1e-9) && o->where == want[z] &&
                   o->units == 34 && ff > 0 &&
                   close_to(o->tail_s, update_by_hand(z, half, own, 34, ff, &last), 1e-9) &&
                   close_to(p1.t_step - p1.sim.offload_overlapped, fmin(pays - last, back), 1e-6),
               "  ... ZeRO-%d, %s: the step %.4f s -> %.4f s: + the update %.4f s (one after the "
               "other %.4f s) + the host's gradient work %.4f s - the device's AdamW %.4f s; "
               "hidden behind the last backward (%.4f s) too it would be %.4f s", z, what[z],
               p0.t_step, p1.t_step, pays, o->serial_s, hostw, adam, back,
               p1.sim.offload_overlapped);
      tsr_plan_destroy(&p0), tsr_plan_destroy(&p1);
    }
  /* the host's additions outlasting the micro-batches: ZeRO-2 with a CPU of 0.05 GB/s a core
   * (0.7 GB/s a GPU), each micro-batch's 12 B an element exposed beyond its compute */
  {
    tsr_config c;
    tsr_plan q;
    int rc = offload_plan("llm7b", 8, 8, 1, 2, 1, 1, &q, &c);
    tsr_plan_destroy(&q);
    c.hardware.cpu_adam_gbps = 0.05;
    tsr_hardware hw;
    tsr_plan_grid g;
    memset(&q, 0, sizeof q);
    rc = rc || tsr_plan_hardware(&c.hardware, &hw) || tsr_plan_layout(&c, 8, 8, &g, NULL, 0) ||
         tsr_plan_make(&q, &c, &hw, &g, 1);
    const tsr_plan_offload *o = rc ? NULL : &q.stages[0].offload;
    const double own = rc ? 0 : o->elements, rate = 0.05 * 112 / 8 * 1e9;
    const double acc = 12 * own / rate, micro = q.sim.f + q.sim.b + q.sim.w;
    TU_CHECK(!rc && close_to(o->accum_s, acc, 1e-9) && close_to(o->micro_s, micro, 1e-9) &&
                 acc > micro && o->micro_batches == g.micro_batches &&
                 close_to(o->accum_exposed_s, g.micro_batches * (acc - micro), 1e-9),
             "ZeRO-2 with the CPU at 0.7 GB/s a GPU: each micro-batch's additions %.4g s against "
             "its %.4g s of compute, %.4g s exposed over %d micro-batches", rc ? 0 : o->accum_s,
             micro, rc ? 0 : o->accum_exposed_s, g.micro_batches);
    tsr_plan_destroy(&q);
  }
  /* hybrid replicas (dp_replicate 2: two nodes, ZeRO-3 sharded over a node's 8 GPUs): the
   * offloaded part's gradient is on the host too, its all-reduce over host memory */
  tsr_plan p0, p1;
  tsr_config c = deck("llm7b");
  c.parallel.tp = 1, c.parallel.pp = 1, c.parallel.virtual_stages = 1;
  c.parallel.schedule = TSR_SCHEDULE_1F1B, c.parallel.sequence_parallel = 0;
  c.parallel.zero_stage = 3, c.parallel.shard_scope = TSR_SHARD_NODE;
  c.train.precision = TSR_BF16, c.train.micro_batch = 1, c.train.recompute = TSR_RECOMPUTE_FULL;
  c.hardware.gpus_per_node = 8;
  tsr_hardware hw;
  tsr_plan_grid g;
  memset(&p0, 0, sizeof p0), memset(&p1, 0, sizeof p1);
  int rc = tsr_plan_hardware(&c.hardware, &hw) || tsr_plan_layout(&c, 16, 8, &g, NULL, 0) ||
           tsr_plan_make(&p0, &c, &hw, &g, 1);
  c.parallel.offload = TSR_OFFLOAD_OPTIMIZER, c.parallel.offload_fraction = 1;
  rc = rc || tsr_plan_make(&p1, &c, &hw, &g, 1);
  if (rc) {
    TU_CHECK(0, "llm7b on 2 x 8, ZeRO-3 with 2 replicas: no plan");
  } else {
    const double own = (double)tsr_zero_padded_length(p1.n_params, 8) / 8;
    const tsr_plan_memory *g0 = &p0.stages[0].mem[TSR_PLAN_GPU];
    const tsr_plan_memory *g1 = &p1.stages[0].mem[TSR_PLAN_GPU];
    const double piece = (g1->host_grads - 4 * own) / (4.0 * TSR_ZERO_GRAD_SLOTS);
    TU_CHECK(g.shard == 8 && g.replicate == 2 && g0->grads == 4 * own && g1->grads == 0 &&
                 piece > 0 && piece < own && g1->host == 18 * own + 12 * piece &&
                 close_to(g0->total - g1->total, 12 * own + 8 * own - 12 * piece, 1e-12) &&
                 p1.stages[0].offload.where == TSR_PLAN_UPDATE_HOST_GRADS,
             "llm7b bf16 ZeRO-3, shard 8 x replicate 2: the gradient shard (%.3f GB) leaves the "
             "device for the host (%.3f GB a GPU, 4 B x own + 3 landing pieces of %.4g), the "
             "device %.3f -> %.3f GB; the update behind the next first forward",
             g0->grads / 1e9, g1->host_grads / 1e9, piece, g0->total / 1e9, g1->total / 1e9);
    /* the replicas' all-reduce: on the network without the offload; with it the whole
     * shard's over host memory, at the slowest of the network, the GPU's share of the
     * node's memory bandwidth (3.5 passes a byte on the wire) and one core's adds (the
     * reduce-scatter half, 3 bytes moved a byte added), after 2 rounds of latency */
    const tsr_plan_traffic *r0 = &p0.stages[0].comm[TSR_PLAN_DP_REPLICATE];
    const tsr_plan_traffic *r1 = &p1.stages[0].comm[TSR_PLAN_DP_REPLICATE];
    const tsr_plan_offload *o1 = &p1.stages[0].offload;
    const double wire = 4 * own; /* 2 (t - 1) / t of the 4-byte shard, t = 2 */
    const double net = wire / (hw.inter_node_gbps * 1e9 * hw.prof.link_eff[TSR_LINK_INTER]);
    const double memory = wire * 3.5 / (hw.host_mem_gbps / 8 * 1e9);
    const double adds = wire / 2 * 3 / (hw.cpu_adam_gbps * 1e9);
    const double want = 2 * hw.prof.link_latency_s[TSR_LINK_INTER] + fmax(net, fmax(memory, adds));
    TU_CHECK(r0->inter_node && close_to(r0->seconds, net, 1e-12) && o1->replica_host_bytes == wire &&
                 close_to(o1->replica_host_s, want, 1e-12) && r1->seconds == o1->replica_host_s &&
                 p1.stages[0].t_dp - p0.stages[0].t_dp > 0.9 * (want - net),
             "llm7b ZeRO-3 2 replicas across nodes: the all-reduce %.4g s on the network, "
             "%.4g s over host memory offloaded (network %.4g, memory %.4g, adds %.4g)",
             r0->seconds, o1->replica_host_s, net, memory, adds);
  }
  tsr_plan_destroy(&p0), tsr_plan_destroy(&p1);
  /* within one node (shards of 4, 2 replicas on the same 8 GPUs): NVLink on the device,
   * shared memory on the host (4.5 passes a byte, no network term); with the built-in
   * core's rate the adds bind, at 100 GB/s a core the memory */
  c.parallel.shard_scope = 4;
  for (int fast = 0; fast < 2; fast++) {
    tsr_plan p2;
    tsr_plan_grid g2;
    memset(&p2, 0, sizeof p2);
    c.hardware.cpu_adam_gbps = fast ? 100 : 0;
    rc = tsr_plan_hardware(&c.hardware, &hw) || tsr_plan_layout(&c, 8, 8, &g2, NULL, 0) ||
         tsr_plan_make(&p2, &c, &hw, &g2, 1);
    if (rc) {
      TU_CHECK(0, "llm7b on 1 x 8, ZeRO-3 shards of 4 with 2 replicas: no plan");
    } else {
      const double own = (double)tsr_zero_padded_length(p2.n_params, 4) / 4, wire = 4 * own;
      const tsr_plan_traffic *r = &p2.stages[0].comm[TSR_PLAN_DP_REPLICATE];
      const double memory = wire * 4.5 / (hw.host_mem_gbps / 8 * 1e9);
      const double adds = wire / 2 * 3 / (hw.cpu_adam_gbps * 1e9);
      const double want = 2 * hw.prof.link_latency_s[TSR_LINK_INTRA] + fmax(memory, adds);
      TU_CHECK(g2.shard == 4 && g2.replicate == 2 && !r->inter_node &&
                   p2.stages[0].offload.replica_host_bytes == wire &&
                   close_to(r->seconds, want, 1e-12) && (fast ? memory > adds : adds > memory),
               "llm7b ZeRO-3 2 replicas in a node, offloaded, cores at %.4g GB/s: %.4g s over "
               "shared memory (memory %.4g, adds %.4g)", hw.cpu_adam_gbps, r->seconds, memory,
               adds);
    }
    tsr_plan_destroy(&p2);
  }
}

/* llm70b on one node of 8 GPUs (tp 8, dp 1, ZeRO 0): without offload it does not fit in 80
 * GB; with it the GPU holds the bf16 weights and fp32 gradients and the node 18 B a
 * parameter in page-locked memory, fitting 2048 GB and not 1000. */
static void test_offload_fit(void) {
  tsr_plan p0, p1;
  int rc = offload_plan("llm70b", 8, 8, 8, 0, 1, 0, &p0, NULL);
  rc |= offload_plan("llm70b", 8, 8, 8, 0, 1, 1, &p1, NULL);
  const double n = (double)tsr_zero_padded_length(p1.stages[0].mem[TSR_PLAN_GPU].params / 2, 1);
  TU_CHECK(rc == 0 && !p0.fits && p1.fits && p1.fits_gpu && p1.fits_host &&
               p1.host_node == 8 * 18 * n,
           "llm70b tp 8 on 1 x 8 H100: %.1f GB without offload (no fit), %.1f GB with it (fits), "
           "%.1f GB of page-locked host memory a node = 8 x 18 B x %.4g", 
           p0.stages[0].mem[TSR_PLAN_GPU].peak / 1e9, p1.stages[0].mem[TSR_PLAN_GPU].peak / 1e9,
           p1.host_node / 1e9, n);
  tsr_plan_destroy(&p0), tsr_plan_destroy(&p1);
  tsr_config c = deck("llm70b");
  c.parallel.tp = 8, c.parallel.pp = 1, c.parallel.virtual_stages = 1;
  c.parallel.schedule = TSR_SCHEDULE_1F1B, c.parallel.zero_stage = 0;
  c.parallel.offload = TSR_OFFLOAD_OPTIMIZER, c.train.micro_batch = 1;
  c.train.recompute = TSR_RECOMPUTE_FULL, c.hardware.host_memory_gb = 1000;
  tsr_hardware hw;
  tsr_plan_grid g;
  rc = tsr_plan_hardware(&c.hardware, &hw);
  if (!rc) rc = tsr_plan_layout(&c, 8, 8, &g, NULL, 0);
  if (!rc) rc = tsr_plan_make(&p1, &c, &hw, &g, 0);
  TU_CHECK(rc == 0 && p1.fits_gpu && !p1.fits_host && !p1.fits,
           "  ... with hardware.host_memory_gb = 1000 the GPU fits, the node's host memory does "
           "not (%.1f GB), and so the plan does not", p1.host_node / 1e9);
  tsr_plan_destroy(&p1);
  /* the built-in host figures and a deck's */
  tsr_deck_defaults(&c);
  const struct { const char *name; double gb, pcie, mem; int cores; } want[] = {
      {"h100", 2048, 50, 394, 112}, {"h200", 2048, 50, 394, 112}, {"a100", 2048, 25, 287, 128}};
  for (int i = 0; i < 3; i++) {
    c.hardware.name = (tsr_hw_name)tu_word("h100|h200|a100|custom", want[i].name);
    rc = tsr_plan_hardware(&c.hardware, &hw);
    TU_CHECK(rc == 0 && hw.host_memory_gb == want[i].gb && hw.pcie_gbps == want[i].pcie &&
                 hw.host_mem_gbps == want[i].mem && hw.cpu_cores == want[i].cores &&
                 hw.cpu_adam_gbps == 11.5,
             "built-in %s node: %.0f GB host memory, %.0f GB/s PCIe a GPU, %d cores at 11.5 GB/s "
             "AdamW each, %.0f GB/s host memory", want[i].name, hw.host_memory_gb,
             hw.pcie_gbps, hw.cpu_cores, hw.host_mem_gbps);
  }
  c.hardware.host_memory_gb = 512, c.hardware.cpu_cores = 16, c.hardware.pcie_gbps = 20;
  c.hardware.cpu_adam_gbps = 5, c.hardware.host_mem_gbps = 100;
  rc = tsr_plan_hardware(&c.hardware, &hw);
  hw.gpus_per_node = 2;
  TU_CHECK(rc == 0 && hw.host_memory_gb == 512 && hw.cpu_cores == 16 && hw.pcie_gbps == 20 &&
               close_to(tsr_plan_cpu_adam_s(&hw, 40e9), 1.0, 1e-12) &&
               close_to(tsr_plan_pcie_s(&hw, 40e9), 2.0, 1e-12),
           "the deck's host figures: 16 cores x 5 GB/s over 2 GPUs = 40 GB/s a GPU (under 100 / "
           "2): 40 GB in %.3f s; at 20 GB/s PCIe in %.3f s", tsr_plan_cpu_adam_s(&hw, 40e9),
           tsr_plan_pcie_s(&hw, 40e9));
  hw.gpus_per_node = 1;
  const double all = tsr_plan_cpu_adam_s(&hw, 100e9);
  hw.host_mem_gbps = 50;
  TU_CHECK(close_to(all, 1.25, 1e-12) && close_to(tsr_plan_cpu_adam_s(&hw, 100e9), 2.0, 1e-12),
           "  ... one GPU a node has all 16 cores: 100 GB in %.3f s at 80 GB/s; at "
           "host_mem_gbps = 50 the memory binds: %.3f s", all, tsr_plan_cpu_adam_s(&hw, 100e9));
  char *over[] = {"parallel.offload=none"};
  TU_CHECK(tsr_plan_search_fixed(1, over) == 1u << TSR_PLAN_FIX_OFFLOAD,
           "parallel.offload on the command line holds the search's offload");
  char *act[] = {"Train.Activation_Offload = T"};
  TU_CHECK(tsr_plan_search_fixed(1, act) == 1u << TSR_PLAN_FIX_ACT_OFFLOAD,
           "train.activation_offload on the command line holds the search's activation offload");
}

int main(void) {
  test_seed_arithmetic();
  test_llm7b_state();
  test_divisibility();
  test_hardware();
  test_in_flight();
  test_model_bytes();
  test_doc_mask();
  test_traffic();
  test_flops_and_bubble();
  test_flop_identities();
  test_headroom();
  test_search_fixed();
  test_compute_peak();
  test_uneven();
  test_cp_grid();
  test_cp_memory();
  test_cp_traffic();
  test_cp_time();
  test_cp_deck();
  test_offload_state();
  test_offload_plan();
  test_offload_fit();
  test_activation_offload();
  return tu_summary("test_plan");
}
