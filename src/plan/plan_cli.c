/* plan_cli.c — the `tessera plan` command around the planner (plan.h): readable tables and
 * JSON of one plan, the options, the exit code (--require-fit); the layout search is
 * plan_search.c.  Rank 0 runs it; it trains nothing. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "deck/deck.h"
#include "sched/pipeline.h"
#include "deck/layout_check.h"
#include "model/model.h"
#include "plan.h"
#include "core/util.h"

/* ---------------------------------------------------------------- text output */

static int half_storage(const tsr_config *cfg) { return cfg->train.precision != TSR_F32; }

/* The deck's word for a choice key of cfg (the functions below all have cfg) */
#define W(field) tsr_deck_word(cfg, &(field))

static const char *link_name(const tsr_plan_traffic *t) {
  return t->size < 2 ? "-" : t->inter_node ? "inter-node" : "intra-node";
}

static void print_head(FILE *out, const tsr_plan *p, const tsr_config *cfg, int nodes) {
  const tsr_plan_grid *g = &p->grid;
  const tsr_hardware *hw = &p->hw;
  const tsr_model_config *m = &cfg->model;
  fprintf(out, "machine  %d node(s) x %d GPUs = %d; %s: %.0f TFLOP/s dense bf16, %.3g fp32, %.0f "
          "GB at %.0f GB/s, links %.0f GB/s in a node, %.0f GB/s between nodes (per GPU, one "
          "way)\n", nodes, g->ranks_per_node, g->world, hw->name, hw->peak_tflops,
          hw->peak_fp32_tflops, hw->hbm_gb, hw->hbm_gbps, hw->intra_node_gbps,
          hw->inter_node_gbps);
  fprintf(out, "model    %s, %lld layers, d_model %lld, %lld heads (%lld KV), d_ff %lld, vocab "
          "%lld, seq_len %lld: %lld parameters (%.3f B)\n", W(m->arch), (long long)m->n_layer,
          (long long)m->d_model, (long long)m->n_head, (long long)m->n_kv_head,
          (long long)m->d_ff, (long long)m->vocab_size, (long long)m->seq_len,
          (long long)p->n_params, (double)p->n_params / 1e9);
  char scope[32], cp[160] = "";
  tsr_shard_scope_text(cfg->parallel.shard_scope, scope, sizeof scope);
  if (g->cp > 1)
    snprintf(cp, sizeof cp, " x cp %d", g->cp);
  fprintf(out, "layout   tp %d%s x dp %d x pp %d, %d chunk(s) per stage, schedule %s%s; ZeRO stage "
          "%lld over %d rank(s) x %d copies (shard_scope '%s')\n", g->tp, cp, g->dp, g->pp, g->v,
          W(cfg->parallel.schedule),
          cfg->parallel.sequence_parallel && g->tp > 1 ? ", sequence parallel" : "",
          (long long)cfg->parallel.zero_stage, g->shard, g->replicate, scope);
  if (g->cp > 1)
    fprintf(out, "context  cp %d (%s): each sequence in 2 x %d chunks of %lld tokens, a cp rank "
            "holding 2 of them, %lld tokens; the dp x cp = %d ranks of a (pp, tp) position "
            "share the parameters and reduce the gradients\n", g->cp,
            cfg->parallel.cp_comm == TSR_CP_A2A ? "a2a: all-to-alls to a head split"
                                                : "p2p: a ring of K/V blocks",
            g->cp, (long long)(m->seq_len / (2 * g->cp)), (long long)(m->seq_len / g->cp),
            g->dpcp);
  fprintf(out, "batch    %lld sequences per step = %d micro-batch(es) of %lld per dp rank (%.4g M "
          "tokens); precision %s, recompute %s\n", (long long)cfg->train.global_batch,
          g->micro_batches, (long long)cfg->train.micro_batch,
          (double)cfg->train.global_batch * (double)m->seq_len / 1e6, W(cfg->train.precision),
          W(cfg->train.recompute));
  const char *split = cfg->parallel.stage_layers;
  char layers[64];
  if (split[0])
    snprintf(layers, sizeof layers, "%lld layers in pp %d x %d chunks as stage_layers says",
             (long long)m->n_layer, g->pp, g->v);
  else
    snprintf(layers, sizeof layers, "%lld layers by pp %d x %d chunks", (long long)m->n_layer,
             g->pp, g->v);
  char cpok[96] = "";
  if (g->cp > 1)
    snprintf(cpok, sizeof cpok, "; seq_len %lld by 2 cp %d%s", (long long)m->seq_len, 2 * g->cp,
             cfg->parallel.cp_comm == TSR_CP_A2A ? ", tp-local heads by cp" : "");
  fprintf(out, "checks   ok: heads, KV heads, d_ff, vocabulary divide by tp %d; %s%s; %lld "
          "sequences by micro_batch %lld x dp %d; tp inside a %d-GPU node\n", g->tp, layers,
          cpok, (long long)cfg->train.global_batch, (long long)cfg->train.micro_batch, g->dp,
          g->ranks_per_node);
  if (!split[0]) return;
  /* an uneven split: the layers of every chunk, and the stage holding the most */
  int counts[TSR_PP_MAX_CHUNKS], full = 0;
  char why[256];
  if (tsr_pp_split_counts(m, g->pp, g->v, split, counts, why, sizeof why)) return;
  fprintf(out, "chunks   stage_layers '%s': layers per chunk", split);
  for (int c = 0; c < g->pp * g->v; c++) fprintf(out, "%s%d", c ? "," : " ", counts[c]);
  for (int s = 1; s < g->pp; s++)
    if (p->stages[s].layers > p->stages[full].layers) full = s;
  const tsr_sched_desc *sd = tsr_sched(cfg->parallel.schedule);
  if (sd->placement == TSR_PLACE_V)
    fprintf(out, "; the fullest stage is %d with %d layers (%s: chunks s and 2 pp - 1 - s on "
            "stage s)\n", full, p->stages[full].layers, sd->word);
  else
    fprintf(out, "; the fullest stage is %d with %d layers (chunk c on stage c %% pp)\n", full,
            p->stages[full].layers);
}

/* A row of the memory table; `host` (< 0: none) the offload's page-locked column. */
static void mem_row(FILE *out, const char *label, double gpu, double cpu, double host) {
  fprintf(out, "  %-36s %12.3f %14.3f", label, gpu / 1e9, cpu / 1e9);
  if (host >= 0) fprintf(out, " %14.3f", host / 1e9);
  fputc('\n', out);
}

static void print_memory(FILE *out, const tsr_plan *p, const tsr_config *cfg) {
  const tsr_plan_memory *g = &p->stages[p->worst[TSR_PLAN_GPU]].mem[TSR_PLAN_GPU];
  const tsr_plan_memory *c = &p->stages[p->worst[TSR_PLAN_CPU]].mem[TSR_PLAN_CPU];
  const tsr_plan_memory *h = &p->stages[p->host_stage].mem[TSR_PLAN_GPU];
  const int off = h->host > 0; /* the host column: page-locked memory of a GPU's rank */
  const double none = -1;
  char gpu[TSR_STR_SHORT + 8];
  snprintf(gpu, sizeof gpu, "GPU, %s", W(cfg->train.precision));
  fprintf(out, "\nmemory per GPU, GB (1e9 bytes)       %12s %14s%s\n", gpu, "this CPU build",
          off ? "  host (pinned)" : "");
  fprintf(out, "  %-36s %12d %14d", "pipeline stage (the fullest)", p->worst[TSR_PLAN_GPU],
          p->worst[TSR_PLAN_CPU]);
  if (off) fprintf(out, " %14d", p->host_stage);
  fputc('\n', out);
  mem_row(out, "parameters", g->params, c->params, off ? h->host_staging : none);
  mem_row(out, "gradients (fp32)", g->grads, c->grads, off ? h->host_grads : none);
  mem_row(out, "master weights (fp32)", g->master, c->master, off ? h->host_master : none);
  mem_row(out, "optimizer state (Adam m, v; fp32)", g->optim, c->optim,
          off ? h->host_optim : none);
  mem_row(out, "activations", g->activations, c->activations, off ? h->host_acts : none);
  fprintf(out, "  %-36s %12d %14d\n", "  sets in flight (micro-batch chunks)", g->in_flight,
          c->in_flight);
  mem_row(out, "communication buffers", g->comm, c->comm, off ? 0 : none);
  mem_row(out, "workspace", g->workspace, c->workspace, off ? 0 : none);
  mem_row(out, "total in a step", g->total, c->total, off ? h->host : none);
  mem_row(out, "peak with setup transients", g->peak, c->peak, off ? h->host : none);
  fprintf(out, "  parameters, activations and their gradients stored in %s on both (an fp32 "
          "run's weights are its master); the CPU build adds its host tables, conversion "
          "buffers and the setup's initial copy\n", W(cfg->train.precision));
  if (off) {
    if (h->host > h->host_acts)
      fprintf(out, "  offload (parallel.offload = 'optimizer', offload_fraction %g): the shard's "
              "fp32 master and Adam m, v (12 bytes a parameter) leave the GPU for page-locked "
              "host memory, which also holds the reduced gradient's fp32 copy (4)%s; the CPU "
              "build offloads nothing\n", tsr_plan_offload_fraction(cfg),
              half_storage(cfg) ? " and the new compute copy's staging (2, in the parameters row)"
                                : "");
    if (h->host_acts > 0)
      fprintf(out, "  activation offload (train.activation_offload): every layer's stored set "
              "and input, for each set in flight, in page-locked host memory; the GPU keeps a "
              "window of %d layers' sets and each set in flight's chunk output; the CPU build "
              "offloads nothing\n", TSR_MODEL_OFFLOAD_WINDOW);
    fprintf(out, "  host per node: %.2f GB = %d GPUs x %.3f GB (stage %d) against "
            "hardware.host_memory_gb = %.6g GB: %s\n", p->host_node / 1e9,
            p->grid.ranks_per_node, h->host / 1e9, p->host_stage, p->hw.host_memory_gb,
            p->fits_host ? "fits" : "does NOT fit");
  }
  char room[96];
  if (p->hw.max_mem_frac < 1)
    snprintf(room, sizeof room, "%.3g x %.4g GB = %.4g GB of HBM (--max-mem-frac)",
             p->hw.max_mem_frac, p->hw.hbm_gb, p->hw.max_mem_frac * p->hw.hbm_gb);
  else
    snprintf(room, sizeof room, "%.4g GB of HBM", p->hw.hbm_gb);
  if (!off) {
    fprintf(out, "  fits: %s (peak %.2f GB + %.1f GB runtime reserve against %s)\n",
            p->fits ? "yes" : "NO", g->peak / 1e9, p->hw.reserved_gb, room);
    return;
  }
  fprintf(out, "  fits: %s (GPU: peak %.2f GB + %.1f GB runtime reserve against %s: %s; host: "
          "%.2f GB a node against %.6g GB: %s)\n", p->fits ? "yes" : "NO", g->peak / 1e9,
          p->hw.reserved_gb, room, p->fits_gpu ? "yes" : "NO", p->host_node / 1e9,
          p->hw.host_memory_gb, p->fits_host ? "yes" : "NO");
  if (!p->fits_host)
    fprintf(out, "  host memory: %s pins %.0f bytes (%.2f GB) a "
            "node, %d GPUs x %.0f bytes, more than hardware.host_memory_gb = %.6g GB: fewer "
            "parameters a GPU (a larger ZeRO group, more nodes) or more host memory\n",
            h->host_acts <= 0 ? "parallel.offload = 'optimizer'"
            : h->host > h->host_acts ? "parallel.offload = 'optimizer' with train.activation_offload"
                                     : "train.activation_offload",
            p->host_node, p->host_node / 1e9, p->grid.ranks_per_node, h->host,
            p->hw.host_memory_gb);
}

static void print_compute(FILE *out, const tsr_plan *p, const tsr_config *cfg) {
  const tsr_plan_grid *g = &p->grid;
  const double tokens = (double)cfg->train.global_batch * (double)cfg->model.seq_len;
  fprintf(out, "\ncompute per step (%.4g M tokens)\n", tokens / 1e6);
  fprintf(out, "  model FLOPs       %.4g PFLOP = 3 x forward %.4g: GEMMs 6 N tokens %.4g + causal "
          "attention %.4g (N = %.4g B weights in GEMMs; lookups, norms, biases and other "
          "element-wise work count none; attention 6 L T d per token); the trainer's MFU "
          "count, the same for every recompute mode\n", p->model_flops / 1e15,
          p->forward_flops / 1e15, (p->model_flops - p->attention_flops) / 1e15,
          p->attention_flops / 1e15, (double)p->n_gemm / 1e9);
  if (cfg->data.document_mask)
    fprintf(out, "  document masking  attention %.4g PFLOP saved: %.3g of its causal pairs left "
            "for documents of %lld tokens on average (data.mean_doc_tokens%s; a memoryless "
            "stream of documents, each token ending one with probability 1 / that)\n",
            p->attention_saved_flops / 1e15, tsr_plan_doc_attention_share(cfg),
            (long long)cfg->data.mean_doc_tokens,
            cfg->data.mean_doc_tokens > 0 ? "" : " not set: no saving counted");
  fprintf(out, "  executed FLOPs    %.4g PFLOP on all GPUs = model + recompute %.4g (recompute "
          "'%s': %s), %.4g TFLOP on one GPU of stage %d\n", p->executed_flops / 1e15,
          p->recompute_flops / 1e15, W(cfg->train.recompute),
          cfg->train.recompute == TSR_RECOMPUTE_FULL
              ? "the layers' forward again"
              : cfg->train.recompute == TSR_RECOMPUTE_SELECTIVE
                    ? "norm outputs and the MLP activation again, element-wise"
                    : "nothing",
          p->stages[p->critical].flops / 1e12, p->critical);
  /* pipeline.h's ideal bubbles (tsr_pp_ideal_bubble), in words */
  const char *theory = tsr_sched(cfg->parallel.schedule)->bubble_formula;
  fprintf(out, "  pipeline bubble   %.4f of the step (schedule %s: %s, p %d, m %d, v %d)\n",
          p->bubble, g->pp > 1 ? W(cfg->parallel.schedule) : "none", theory, g->pp,
          g->micro_batches, g->pp > 1 && g->v > 1 ? g->v : 1);
}

static void print_traffic(FILE *out, const tsr_plan *p) {
  const tsr_plan_stage *st = &p->stages[p->critical];
  fprintf(out, "\ntraffic per GPU per step on stage %d (ring-algorithm bytes, as comm.c counts; "
          "fp32 buffers)\n  %-13s %5s  %-10s %12s %10s  %s\n", p->critical, "group", "ranks",
          "link", "GB/step", "time s", "by kind, GB");
  for (int i = 0; i < TSR_PLAN_N_GROUPS; i++) {
    const tsr_plan_traffic *t = &st->comm[i];
    if (t->total <= 0 && t->bytes[TSR_COMM_SCALAR] <= 0) continue; /* not used here */
    char kinds[256] = "";
    size_t used = 0;
    for (int k = 0; k < TSR_COMM_N_KINDS && used < sizeof kinds; k++)
      if (t->bytes[k] > 0)
        used += (size_t)snprintf(kinds + used, sizeof kinds - used, "%s%s %.4g", used ? ", " : "",
                                 tsr_comm_kind_name((tsr_comm_kind)k), t->bytes[k] / 1e9);
    fprintf(out, "  %-13s %5d  %-10s %12.4f %10.4f  %s\n", t->name, t->size, link_name(t),
            t->total / 1e9, t->seconds, kinds[0] ? kinds : "-");
  }
  const tsr_plan_offload *o = &st->offload;
  if (o->replica_host_bytes > 0) /* of dp_replicate's row, the part over host memory */
    fprintf(out, "  %-13s %5s  %-10s %12.4f %10.4f  of dp_replicate's: the offloaded part's "
            "all-reduce over host memory (MPI), after the device's part (at the slowest of "
            "the link, the GPU's share of host_mem_gbps and one core's adds)\n",
            "  host part", "", "host", o->replica_host_bytes / 1e9, o->replica_host_s);
  if (o->fraction > 0) /* the offload's copies between this GPU and its host */
    fprintf(out, "  %-13s %5d  %-10s %12.4f %10.4f  to the host %.4g, back %.4g (at "
            "hardware.pcie_gbps = %.4g GB/s each way)\n", "host (offload)", 1, "PCIe",
            (o->d2h_bytes + o->h2d_bytes) / 1e9, o->d2h_s + o->h2d_s, o->d2h_bytes / 1e9,
            o->h2d_bytes / 1e9, p->hw.pcie_gbps);
  if (st->act_bytes > 0) /* the activation offload's layer blocks, behind the layers */
    fprintf(out, "  %-13s %5d  %-10s %12.4f %10.4f  to the host %.4g, back %.4g (behind the "
            "layers' compute; %.4g s of it not hidden, in the compute time)\n",
            "host (act offload)", 1, "PCIe", (st->act_bytes + st->act_back) / 1e9,
            tsr_plan_pcie_s(&p->hw, st->act_bytes + st->act_back), st->act_bytes / 1e9,
            st->act_back / 1e9, st->act_exposed);
}

/* The offloaded update of the stage with the largest shard: its three parts, how the
 * trainer runs them (tsr_plan_offload_place's case) and what the step pays. */
static void print_offload(FILE *out, const tsr_plan *p, const tsr_config *cfg,
                          const tsr_plan_offload *o) {
  const tsr_hardware *hw = &p->hw;
  const double per_gpu = hw->gpus_per_node > 0 ? hw->gpus_per_node : 1;
  fprintf(out, "  offloaded update   %10.4f s  of the tail (stage %d, the largest shard), in "
          "pieces of %.0f elements: gradient to the host %.4g s, the CPU's AdamW %.4g s (%.4g "
          "GB, %d bytes a parameter, at %.4g GB/s a GPU: %.4g of hardware.cpu_cores = %d at "
          "cpu_adam_gbps = %.4g, at most host_mem_gbps = %.4g over %d GPUs), compute copy "
          "back %.4g s (one after the other %.4g s); ", o->tail_s, p->host_stage, o->piece,
          o->d2h_s, o->cpu_s, o->cpu_bytes / 1e9, half_storage(cfg) ? 30 : 28,
          o->cpu_s > 0 ? o->cpu_bytes / o->cpu_s / 1e9 : 0, hw->cpu_cores / per_gpu,
          hw->cpu_cores, hw->cpu_adam_gbps, hw->host_mem_gbps, (int)per_gpu, o->h2d_s,
          o->serial_s);
  if (o->where == TSR_PLAN_UPDATE_DEVICE_GRADS)
    fprintf(out, "the three pipelined (ZeRO 0-1: the gradient on the device, its units "
            "queued to the host at the update): the slowest plus one piece of the other two, "
            "%.4g s", o->update_s);
  else
    fprintf(out, "the gradient already on the host (copied unit by unit during the backward, "
            "the last of %d units' copy left: %.4g s), then the CPU's AdamW and the copy back "
            "pipelined, %.4g s", o->units, o->last_d2h_s, o->update_s);
  fprintf(out, ", behind the next step's first forward (each unit's part updated as that "
          "forward first asks for the unit), %.4g s, which hides %.4g s of it\n",
          o->first_forward_s, fmin(o->update_s, o->first_forward_s));
  if (o->where == TSR_PLAN_UPDATE_HOST_GRADS)
    fprintf(out, "  host gradient work %10.4f s  the gradient on the host: each micro-batch's "
            "pieces added there as they land, %.4g s against the micro-batch's %.4g s (%d of "
            "them: %.4g s not hidden), and the gradient norm's pass over it, %.4g s, at the "
            "CPU AdamW's rate\n", o->accum_exposed_s + o->host_norm_s, o->accum_s, o->micro_s,
            o->micro_batches, o->accum_exposed_s, o->host_norm_s);
  fprintf(out, "  if overlapped      %10.4f s  the step if the offloaded update were also hidden "
          "behind the last micro-batch's backward (%.4g s less): not implemented, the update "
          "needs the gradient norm first (clipping, the fp16 skip)\n", p->sim.offload_overlapped,
          p->t_step - p->sim.offload_overlapped);
}

static void print_time(FILE *out, const tsr_plan *p, const tsr_config *cfg) {
  const tsr_plan_stage *st = &p->stages[p->critical];
  const tsr_hardware *hw = &p->hw;
  const double busy = st->t_compute + st->t_tp + st->t_cp + st->t_pp;
  fprintf(out, "\npredicted step (implementation '%s': %s%s)\n", W(cfg->hardware.implementation),
          hw->prof.source, hw->compute_efficiency > 0 || hw->comm_efficiency > 0
                               ? "; flat efficiencies from the deck" : "");
  const double ms = 1e3;
  char w[48] = "", cp[80] = "";
  if (p->sim.w > 0) snprintf(w, sizeof w, ", W %.4g ms", p->sim.w * ms);
  if (p->grid.cp > 1)
    snprintf(cp, sizeof cp, ", cp transfers left exposed %.4g ms", p->sim.cp * ms);
  fprintf(out, "  one micro-batch    on stage %d: forward %.4g ms, backward %.4g ms%s (GEMMs "
          "%.4g, attention %.4g, element-wise %.4g, tp collectives %.4g ms%s)\n", p->sim.critical,
          p->sim.f * ms, p->sim.b * ms, w, p->sim.gemm * ms, p->sim.attention * ms,
          p->sim.memory * ms, p->sim.tp * ms, cp);
  fprintf(out, "  schedule replay    %10.4f s  the last stage's end; idle over each stage's own "
          "time %.4f mean, %.4f max (the trainer's bubble line); over the step %.4f (closed "
          "form %.4f)\n", p->sim.pipeline, p->sim.idle_mean, p->sim.idle_max, p->sim.bubble,
          p->bubble);
  fprintf(out, "  reductions end     %10.4f s  data-parallel gradient reductions, overlapped with "
          "the backward they follow\n", p->sim.reduced);
  fprintf(out, "  tail               %10.4f s  tied embedding, gradient norm, AdamW over the "
          "shard%s, parameter gathers after it\n", p->sim.tail,
          p->sim.offload > 0 ? " (its offloaded part on the CPU: below)" : "");
  const tsr_plan_offload *o = &p->stages[p->host_stage].offload;
  if (o->fraction > 0) print_offload(out, p, cfg, o);
  fprintf(out, "  step               %10.4f s  = %.4g tokens/s, %.4g TFLOP/s per GPU, MFU %.3f\n",
          p->t_step, p->tokens_per_s, p->sim.tflops_per_gpu, p->mfu);
  char cpt[48] = "";
  if (p->grid.cp > 1) snprintf(cpt, sizeof cpt, ", cp %.4f s", st->t_cp);
  fprintf(out, "  closed form        %10.4f s  cross-check: stage %d computes %.4f s, tp %.4f s%s, "
          "pipeline transfers %.4f s, bubble %.4f s, dp + optimizer %.4f s\n",
          p->sim.closed_step, p->critical, st->t_compute, st->t_tp, cpt, st->t_pp,
          p->sim.closed_pipeline - busy, p->sim.closed_step - p->sim.closed_pipeline);
}

void tsr_plan_print(FILE *out, const tsr_plan *p, const tsr_config *cfg, int nodes) {
  print_head(out, p, cfg, nodes);
  print_memory(out, p, cfg);
  print_compute(out, p, cfg);
  print_traffic(out, p);
  print_time(out, p, cfg);
  tsr_plan_print_checkpoint(out, p, cfg);
}

/* ---------------------------------------------------------------- JSON output */

static void json_memory(FILE *out, const tsr_plan_memory *m) {
  fprintf(out, "{\"params\": %.0f, \"grads\": %.0f, \"master\": %.0f, \"optim\": %.0f, "
          "\"activations\": %.0f, \"comm\": %.0f, \"workspace\": %.0f, \"total\": %.0f, "
          "\"peak\": %.0f, \"in_flight\": %d, \"host\": {\"master\": %.0f, \"optim\": %.0f, "
          "\"grads\": %.0f, \"staging\": %.0f, \"acts\": %.0f, \"total\": %.0f}}", m->params,
          m->grads, m->master, m->optim, m->activations, m->comm, m->workspace, m->total, m->peak,
          m->in_flight, m->host_master, m->host_optim, m->host_grads, m->host_staging,
          m->host_acts, m->host);
}

static void json_offload(FILE *out, const tsr_plan_offload *o) {
  static const char *const where[] = {"device_grads", "host_grads"};
  fprintf(out, "{\"fraction\": %.6g, \"elements\": %.0f, \"piece\": %.0f, "
          "\"d2h_bytes\": %.0f, \"h2d_bytes\": %.0f, "
          "\"cpu_bytes\": %.0f, \"d2h_s\": %.6g, \"cpu_s\": %.6g, \"h2d_s\": %.6g, "
          "\"serial_s\": %.6g, \"pipelined_s\": %.6g, \"case\": \"%s\", \"units\": %d, "
          "\"last_d2h_s\": %.6g, \"update_s\": %.6g, \"first_forward_s\": %.6g, "
          "\"tail_s\": %.6g, \"accum_s\": %.6g, \"micro_s\": %.6g, \"micro_batches\": %d, "
          "\"accum_exposed_s\": %.6g, \"host_norm_s\": %.6g, \"replica_host_bytes\": %.0f, "
          "\"replica_host_s\": %.6g}", o->fraction, o->elements, o->piece,
          o->d2h_bytes, o->h2d_bytes, o->cpu_bytes, o->d2h_s, o->cpu_s, o->h2d_s, o->serial_s,
          o->pipelined_s, where[o->where], o->units, o->last_d2h_s, o->update_s,
          o->first_forward_s, o->tail_s, o->accum_s, o->micro_s, o->micro_batches,
          o->accum_exposed_s, o->host_norm_s, o->replica_host_bytes, o->replica_host_s);
}

static void json_traffic(FILE *out, const tsr_plan_traffic *t) {
  fputc('{', out);
  for (int i = 0; i < TSR_PLAN_N_GROUPS; i++) {
    fprintf(out, "%s\"%s\": {\"size\": %d, \"link\": \"%s\", \"bytes\": %.0f", i ? ", " : "",
            t[i].name, t[i].size, link_name(&t[i]), t[i].total);
    for (int k = 0; k < TSR_COMM_N_KINDS; k++)
      if (t[i].bytes[k] > 0)
        fprintf(out, ", \"%s\": %.0f", tsr_comm_kind_name((tsr_comm_kind)k), t[i].bytes[k]);
    fputc('}', out);
  }
  fputc('}', out);
}

static void json_stage(FILE *out, const tsr_plan_stage *st, int s) {
  fprintf(out, "    {\"stage\": %d, \"layers\": %d, \"memory_gpu\": ", s, st->layers);
  json_memory(out, &st->mem[TSR_PLAN_GPU]);
  fprintf(out, ", \"memory_cpu_build\": ");
  json_memory(out, &st->mem[TSR_PLAN_CPU]);
  fprintf(out, ",\n     \"flops\": %.17g, \"recompute_flops\": %.17g, \"traffic\": ", st->flops,
          st->recompute_flops);
  json_traffic(out, st->comm);
  fprintf(out, ",\n     \"offload\": ");
  json_offload(out, &st->offload);
  fprintf(out, ",\n     \"act_offload\": {\"bytes_to_host\": %.0f, \"bytes_back\": %.0f, "
          "\"exposed_s\": %.6g}", st->act_bytes, st->act_back, st->act_exposed);
  fprintf(out, ",\n     \"time_s\": {\"compute\": %.6g, \"tp\": %.6g, \"cp\": %.6g, "
          "\"pp\": %.6g, \"dp_exposed\": %.6g, \"optimizer\": %.6g},\n     \"sim\": "
          "{\"end_s\": %.6g, \"busy_s\": %.6g, \"idle_fraction\": %.6g}}", st->t_compute,
          st->t_tp, st->t_cp, st->t_pp, st->t_dp, st->t_optimizer, st->sim_end, st->sim_busy,
          st->sim_idle);
}

static void json_profile(FILE *out, const tsr_hardware *hw) {
  const tsr_plan_profile *p = &hw->prof;
  fprintf(out, "\"profile\": {\"gemm_efficiency\": %.6g, \"gemm_fp32_efficiency\": %.6g, "
          "\"gemm_half_dim\": %.6g, \"attention_efficiency\": %.6g, "
          "\"attention_bwd_efficiency\": %.6g, \"attention_fp32_efficiency\": %.6g, "
          "\"attention_fp32_bwd_efficiency\": %.6g, \"attention_half_seq\": %.6g, "
          "\"attention_half_hd\": %.6g, \"memory_efficiency\": %.6g, \"kernel_us\": %.6g, "
          "\"intra_node_efficiency\": %.6g, \"inter_node_efficiency\": %.6g, "
          "\"intra_node_latency_us\": %.6g, \"inter_node_latency_us\": %.6g, "
          "\"tp_overlap\": %.6g, \"gather_overlap\": %.6g, \"slowdown\": %.6g, "
          "\"source\": \"%s\"}",
          p->gemm_eff[1], p->gemm_eff[0], p->gemm_half_dim, p->attn_fwd[1], p->attn_bwd[1],
          p->attn_fwd[0], p->attn_bwd[0], p->attn_half_seq, p->attn_half_hd, p->mem_eff,
          p->kernel_s * 1e6, p->link_eff[0], p->link_eff[1], p->link_latency_s[0] * 1e6,
          p->link_latency_s[1] * 1e6, p->tp_overlap, p->gather_overlap, p->slowdown, p->source);
}

/* The stage whose schedule ends last in the replay. */
static int last_stage(const tsr_plan *p) {
  int last = 0;
  for (int s = 1; s < p->grid.pp; s++)
    if (p->stages[s].sim_end > p->stages[last].sim_end) last = s;
  return last;
}

void tsr_plan_print_json(FILE *out, const tsr_plan *p, const tsr_config *cfg, int nodes) {
  const tsr_plan_grid *g = &p->grid;
  const tsr_hardware *hw = &p->hw;
  fprintf(out, "{\n  \"machine\": {\"nodes\": %d, \"gpus_per_node\": %d, \"world\": %d, "
          "\"hardware\": \"%s\", \"peak_tflops\": %.6g, \"peak_fp32_tflops\": %.6g, "
          "\"hbm_gb\": %.6g, \"hbm_gbps\": %.6g, \"intra_node_gbps\": %.6g, "
          "\"inter_node_gbps\": %.6g, \"compute_efficiency\": %.6g, \"comm_efficiency\": %.6g, "
          "\"reserved_gb\": %.6g, \"max_mem_frac\": %.6g, \"implementation\": \"%s\",\n   "
          "\"host_memory_gb\": %.6g, \"pcie_gbps\": %.6g, \"cpu_cores\": %d, "
          "\"cpu_adam_gbps\": %.6g, \"host_mem_gbps\": %.6g,\n   ",
          nodes, g->ranks_per_node, g->world, hw->name, hw->peak_tflops, hw->peak_fp32_tflops,
          hw->hbm_gb, hw->hbm_gbps, hw->intra_node_gbps, hw->inter_node_gbps,
          hw->compute_efficiency, hw->comm_efficiency, hw->reserved_gb, hw->max_mem_frac,
          W(cfg->hardware.implementation), hw->host_memory_gb, hw->pcie_gbps, hw->cpu_cores,
          hw->cpu_adam_gbps, hw->host_mem_gbps);
  json_profile(out, hw);
  fprintf(out, "},\n");
  fprintf(out, "  \"model\": {\"arch\": \"%s\", \"n_params\": %lld, \"precision\": \"%s\", "
          "\"recompute\": \"%s\"},\n", W(cfg->model.arch), (long long)p->n_params,
          W(cfg->train.precision), W(cfg->train.recompute));
  fprintf(out, "  \"layout\": {\"tp\": %d, \"cp\": %d, \"cp_comm\": \"%s\", \"dp\": %d, "
          "\"pp\": %d, \"virtual_stages\": %d, \"zero_stage\": %lld, \"shard\": %d, "
          "\"replicate\": %d, \"micro_batch\": %lld, \"micro_batches\": %d, \"schedule\": "
          "\"%s\", \"sequence_parallel\": %s},\n", g->tp, g->cp, W(cfg->parallel.cp_comm),
          g->dp, g->pp, g->v, (long long)cfg->parallel.zero_stage, g->shard, g->replicate,
          (long long)cfg->train.micro_batch, g->micro_batches, W(cfg->parallel.schedule),
          cfg->parallel.sequence_parallel && g->tp > 1 ? "true" : "false");
  fprintf(out, "  \"memory\": {\"gpu_stage\": %d, \"gpu\": ", p->worst[TSR_PLAN_GPU]);
  json_memory(out, &p->stages[p->worst[TSR_PLAN_GPU]].mem[TSR_PLAN_GPU]);
  fprintf(out, ",\n             \"cpu_build_stage\": %d, \"cpu_build\": ", p->worst[TSR_PLAN_CPU]);
  json_memory(out, &p->stages[p->worst[TSR_PLAN_CPU]].mem[TSR_PLAN_CPU]);
  fprintf(out, ", \"fits\": %s, \"fits_gpu\": %s, \"fits_host\": %s,\n             "
          "\"host_stage\": %d, \"host_per_gpu\": %.0f, \"host_per_node\": %.0f},\n",
          p->fits ? "true" : "false", p->fits_gpu ? "true" : "false",
          p->fits_host ? "true" : "false", p->host_stage,
          p->stages[p->host_stage].mem[TSR_PLAN_GPU].host, p->host_node);
  fprintf(out, "  \"offload\": {\"offload\": \"%s\", \"fraction\": %.6g, \"stage\": %d, "
          "\"update\": ", W(cfg->parallel.offload), p->stages[p->host_stage].offload.fraction,
          p->host_stage);
  json_offload(out, &p->stages[p->host_stage].offload);
  fprintf(out, ", \"tail_s\": %.6g, \"overlapped_step_s\": %.6g},\n", p->sim.offload,
          p->sim.offload_overlapped);
  const tsr_plan_stage *cs = &p->stages[p->critical];
  fprintf(out, "  \"act_offload\": {\"on\": %s, \"stage\": %d, \"bytes_to_host\": %.0f, "
          "\"bytes_back\": %.0f, \"pcie_s\": %.6g, \"exposed_s\": %.6g},\n",
          cs->act_bytes > 0 ? "true" : "false", p->critical, cs->act_bytes, cs->act_back,
          tsr_plan_pcie_s(hw, cs->act_bytes + cs->act_back), cs->act_exposed);
  fprintf(out, "  \"flops\": {\"model\": %.17g, \"forward\": %.17g, \"attention\": %.17g, "
          "\"attention_saved\": %.17g, \"recompute\": %.17g, \"executed\": %.17g, "
          "\"gemm_weights\": %lld},\n",
          p->model_flops, p->forward_flops, p->attention_flops, p->attention_saved_flops,
          p->recompute_flops, p->executed_flops, (long long)p->n_gemm);
  tsr_plan_json_checkpoint(out, p, cfg);
  fprintf(out, "  \"bubble\": %.6g,\n  \"time\": {\"critical_stage\": %d, \"pipeline_s\": %.6g, "
          "\"step_s\": %.6g, \"tokens_per_s\": %.6g, \"mfu\": %.6g,\n           "
          "\"tflops_per_gpu\": %.6g, \"idle_fraction\": %.6g, \"idle_fraction_max\": %.6g, "
          "\"sim_bubble\": %.6g, \"reductions_end_s\": %.6g, \"tail_s\": %.6g,\n           "
          "\"closed_form_step_s\": %.6g, \"closed_form_pipeline_s\": %.6g, \"last_stage\": %d,"
          "\n           \"micro_batch_s\": {\"stage\": %d, \"forward\": %.6g, \"backward\": "
          "%.6g, \"w\": %.6g, \"gemm\": %.6g, \"attention\": %.6g, \"memory\": %.6g, "
          "\"tp\": %.6g, \"cp\": %.6g}},\n  \"stages\": [\n",
          p->bubble, p->critical, p->t_pipeline, p->t_step, p->tokens_per_s, p->mfu,
          p->sim.tflops_per_gpu, p->sim.idle_mean, p->sim.idle_max, p->sim.bubble,
          p->sim.reduced, p->sim.tail, p->sim.closed_step, p->sim.closed_pipeline,
          last_stage(p), p->sim.critical, p->sim.f, p->sim.b, p->sim.w, p->sim.gemm,
          p->sim.attention, p->sim.memory, p->sim.tp, p->sim.cp);
  for (int s = 0; s < g->pp; s++) {
    if (!p->stages[s].done) continue;
    json_stage(out, &p->stages[s], s);
    fprintf(out, "%s\n", s + 1 < g->pp ? "," : "");
  }
  fprintf(out, "  ]\n}\n");
}

/* ---------------------------------------------------------------- the command */

typedef struct {
  const char *deck;
  int nodes, json, search, top, help, require_fit;
  double max_mem_frac; /* --max-mem-frac: (0, 1], default 1 */
  unsigned fixed;      /* the searched keys the overrides hold (tsr_plan_search_fixed) */
  int deck_invalid;    /* --search: the deck's own layout does not go with the held keys */
  char extra[3][TSR_STR_SHORT + 32]; /* --hardware, --gpus-per-node, --implementation as
                                        deck overrides */
  const char *profile;               /* --profile FILE: its &hardware group */
  int print_profile;                 /* --print-profile */
  int n_over;
  char **over;
} plan_args;

static void plan_usage(FILE *out) {
  fprintf(out,
          "usage: tessera plan DECK [--nodes N] [--gpus-per-node G] [--hardware h100|h200|a100|"
          "custom|cpu]\n"
          "                    [--implementation tessera|reference] [--profile FILE]\n"
          "                    [--max-mem-frac F] [--require-fit] [--json] [--search [--top K]]\n"
          "                    [--print-profile] [group.key=value ...]\n"
          "  Plans the deck's layout on N nodes (default 1) of G GPUs (default &hardware\n"
          "  gpus_per_node, else 8): memory per GPU, FLOPs, traffic, predicted step time.\n"
          "  The step time replays the schedule the trainer runs with every kernel and\n"
          "  transfer priced by the machine's profile:\n"
          "  --implementation  tessera (default): Tessera's kernels as measured; reference:\n"
          "                  a well-tuned stack (cuBLAS GEMMs, FlashAttention-class\n"
          "                  attention, tp collectives overlapped): what the layout could do\n"
          "  --profile FILE  the machine from FILE's &hardware group (what\n"
          "                  bench/cuda_kernels --profile writes), instead of the deck's\n"
          "  --hardware cpu  this host, its kernel rates measured at start-up (G = ranks per\n"
          "                  node; under mpirun -np 2 the link between two ranks is measured)\n"
          "  --print-profile print the machine in deck syntax (a profile file) and exit\n"
          "  --search        rank every layout that fits (the K fastest, default 10), with\n"
          "                  context parallelism when seq_len >= 16384 or nothing fits\n"
          "                  without it, then the optimizer offload when still nothing\n"
          "                  fits, then the activation offload as well when nothing fits\n"
          "                  even so.  A group.key=value of a key it\n"
          "                  varies holds it: parallel.{tp, cp, cp_comm, pp,\n"
          "                  virtual_stages, schedule, sequence_parallel, zero_stage,\n"
          "                  shard_scope, micro_batches, offload}, train.{micro_batch,\n"
          "                  recompute, activation_offload}.  When nothing fits,\n"
          "                  it names the smallest larger node count at which a layout does\n"
          "  --max-mem-frac  fit only when the GPU's peak plus hardware.reserved_gb is at\n"
          "                  most F x hardware.hbm_gb (0 < F <= 1, default 1); with\n"
          "                  parallel.offload or train.activation_offload a node's host\n"
          "                  memory must also fit in hardware.host_memory_gb\n"
          "  --require-fit   exit 3 when the plan does not fit (with --search: when no\n"
          "                  layout fits); without it a plan exits 0 either way\n"
          "  exit codes: 0 planned, 2 bad input or a layout that does not divide, 3 does not\n"
          "  fit (--require-fit only)\n");
}

static int bad_usage(const char *what, const char *arg) {
  fprintf(stderr, arg[0] ? "tessera plan: %s '%s'\n" : "tessera plan: %s\n", what, arg);
  plan_usage(stderr);
  return TSR_ERR_INPUT;
}

/* "--name value" or "--name=value": the value, advancing *i past it; NULL if missing. */
static const char *option_value(int argc, char **argv, int *i) {
  const char *eq = strchr(argv[*i], '=');
  if (eq) return eq + 1;
  return *i + 1 < argc ? argv[++*i] : NULL;
}

const char *const tsr_plan_valued_options[] = {"--nodes", "--top", "--gpus-per-node",
                                               "--hardware", "--max-mem-frac",
                                               "--implementation", "--profile", NULL};

static int valued(const char *arg, size_t n) {
  for (const char *const *o = tsr_plan_valued_options; *o; o++)
    if (n == strlen(*o) && !strncmp(arg, *o, n)) return 1;
  return 0;
}

static int parse_option(int argc, char **argv, int *i, plan_args *a) {
  const char *arg = argv[*i];
  const size_t n = strcspn(arg, "=");
#define OPT(name) (n == strlen(name) && !strncmp(arg, name, n))
  if (OPT("--json")) return a->json = 1, 0;
  if (OPT("--search")) return a->search = 1, 0;
  if (OPT("--require-fit")) return a->require_fit = 1, 0;
  if (OPT("--help") || OPT("-h")) return a->help = 1, 0;
  if (OPT("--print-profile")) return a->print_profile = 1, 0;
  const char *v = valued(arg, n) ? option_value(argc, argv, i) : NULL;
  if (!v) return bad_usage("unknown option or missing value:", arg);
  char *end = NULL;
  if (OPT("--max-mem-frac")) {
    const double f = strtod(v, &end);
    if (!v[0] || *end || !(f > 0 && f <= 1))
      return bad_usage("--max-mem-frac takes a fraction of the GPU's memory, 0 < F <= 1, not",
                       v);
    a->max_mem_frac = f;
    return 0;
  }
  const long num = strtol(v, &end, 10);
  if (OPT("--hardware")) {
    snprintf(a->extra[0], sizeof a->extra[0], "hardware.name=%s", v);
    return 0;
  }
  if (OPT("--implementation")) {
    if (strcmp(v, "tessera") && strcmp(v, "reference"))
      return bad_usage("--implementation takes tessera or reference, not", v);
    snprintf(a->extra[2], sizeof a->extra[2], "hardware.implementation=%s", v);
    return 0;
  }
  if (OPT("--profile")) return a->profile = v, 0;
  if (!v[0] || *end || num < 1 || num > 1000000) return bad_usage("expected a positive number:", v);
  if (OPT("--nodes")) a->nodes = (int)num;
  if (OPT("--top")) a->top = (int)num;
  if (OPT("--gpus-per-node"))
    snprintf(a->extra[1], sizeof a->extra[1], "hardware.gpus_per_node=%ld", num);
  return 0;
#undef OPT
}

static int parse_args(int argc, char **argv, plan_args *a) {
  memset(a, 0, sizeof *a);
  a->nodes = 1;
  a->top = 10;
  a->max_mem_frac = 1;
  a->over = tsr_calloc((size_t)argc + 3, sizeof *a->over);
  TSR_CHECK(a->over, TSR_ERR, "out of memory");
  for (int i = 0; i < argc; i++) {
    if (argv[i][0] == '-') {
      TSR_CALL(parse_option(argc, argv, &i, a));
    } else if (strchr(argv[i], '=')) {
      a->over[a->n_over++] = argv[i];
    } else if (!a->deck) {
      a->deck = argv[i];
    } else {
      return bad_usage("a second deck?", argv[i]);
    }
  }
  a->fixed = tsr_plan_search_fixed(a->n_over, a->over); /* the user's, not the extras */
  for (int k = 0; k < 3; k++)
    if (a->extra[k][0]) a->over[a->n_over++] = a->extra[k];
  if (!a->deck && !a->help) return bad_usage("no deck given", "");
  return 0;
}

static char *read_text(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = (size_t)64 << 20;
  char *text = malloc(cap);
  *len = text ? fread(text, 1, cap, f) : 0;
  const int bad = !text || ferror(f) || *len == cap;
  fclose(f);
  if (bad) {
    free(text);
    return NULL;
  }
  return text;
}

/* Nodes x GPUs per node in 64 bits: each is capped at 1e6 (hardware.gpus_per_node at 65536),
 * so the product can pass the int every rank count is. */
static int world_size(int nodes, const tsr_hardware *hw, int *world) {
  const int64_t w = (int64_t)nodes * hw->gpus_per_node;
  if (w > INT_MAX) {
    fprintf(stderr, "tessera plan: --nodes %d x --gpus-per-node %d (hardware.gpus_per_node) = "
            "%lld GPUs, more than the %d a plan can count: give fewer nodes or GPUs per node\n",
            nodes, hw->gpus_per_node, (long long)w, INT_MAX);
    return TSR_ERR_INPUT;
  }
  *world = (int)w;
  return 0;
}

/* What a search puts in place of the deck's values of the searched keys the command line
 * does not hold, when those do not go with the held ones (parallel.pp=16 against the
 * deck's 2 chunks of 80 layers): by TSR_PLAN_FIX_*, NULL for keys no check involves.  The
 * schedule's is one that takes any number of chunks on the round placement, from the
 * registry (derived once). */
static const char *neutral(int k) {
  static const char *const fixed[TSR_PLAN_N_SEARCHED] = {
      "parallel.tp=1", "parallel.cp=1", NULL, "parallel.pp=1", "parallel.virtual_stages=1", NULL,
      "parallel.sequence_parallel=F", NULL, "parallel.shard_scope=global", "train.micro_batch=1",
      "parallel.micro_batches=0", NULL, NULL, NULL};
  static char schedule[64];
  if (k != TSR_PLAN_FIX_SCHEDULE) return fixed[k];
  if (!schedule[0])
    snprintf(schedule, sizeof schedule, "parallel.schedule=%s",
             tsr_sched(tsr_sched_for(TSR_PLACE_ROUND, 2))->word);
  return schedule;
}

/* The deck with the neutral values before the command line's overrides, on the held tp x cp
 * x pp ranks (cfg: the deck as read, its checks failed).  A held parallel.micro_batches depends on the
 * world size: it is checked as 0 and put back. */
static int parse_neutral(const plan_args *a, const char *text, size_t len, tsr_config *cfg) {
  char **over = tsr_calloc((size_t)a->n_over + TSR_PLAN_N_SEARCHED + 1, sizeof *over);
  TSR_CHECK(over, TSR_ERR, "out of memory");
  char err[16384], pp_over[48];
  int n = 0, pp_at = -1;
  for (int k = 0; k < TSR_PLAN_N_SEARCHED; k++)
    if (neutral(k) && !(a->fixed & (1u << k))) {
      if (k == TSR_PLAN_FIX_PP) pp_at = n;
      over[n++] = (char *)neutral(k);
    }
  for (int i = 0; i < a->n_over; i++) over[n++] = a->over[i];
  const int64_t micro_batches = cfg->parallel.micro_batches;
  if (a->fixed & (1u << TSR_PLAN_FIX_MICRO_BATCHES))
    over[n++] = (char *)neutral(TSR_PLAN_FIX_MICRO_BATCHES);
  int64_t tp = a->fixed & (1u << TSR_PLAN_FIX_TP) ? cfg->parallel.tp : 1;
  const int64_t cp = a->fixed & (1u << TSR_PLAN_FIX_CP) ? cfg->parallel.cp : 1;
  int64_t pp = a->fixed & (1u << TSR_PLAN_FIX_PP) ? cfg->parallel.pp : 1;
  int rc = TSR_ERR_INPUT;
  if (tp >= 1 && cp >= 1 && pp >= 1 && tp * cp <= INT_MAX / pp)
    rc = tsr_deck_parse(cfg, text, len, a->deck, n, over, (int)(tp * cp * pp), err, sizeof err);
  /* pp not held: a held virtual_stages > 1 needs a pipeline, so try the first pp that
   * goes with it */
  tp *= cp >= 1 ? cp : 1; /* the ranks of a pipeline stage's (tp, cp) block */
  for (pp = 2; rc && pp_at >= 0 && pp <= 1024 && tp * pp <= INT_MAX; pp++) {
    snprintf(pp_over, sizeof pp_over, "parallel.pp=%lld", (long long)pp);
    over[pp_at] = pp_over;
    rc = tsr_deck_parse(cfg, text, len, a->deck, n, over, (int)(tp * pp), err, sizeof err);
  }
  if (!rc) cfg->parallel.micro_batches = micro_batches;
  tsr_free(&over);
  return rc;
}

/* --profile FILE: the file's &hardware group in place of the deck's, the command line's
 * hardware.* keys on top.  The file is read as a deck (any other group in it is read and
 * left unused). */
static int apply_profile(const plan_args *a, tsr_config *cfg) {
  if (!a->profile) return 0;
  size_t len = 0;
  char *text = read_text(a->profile, &len), err[8192];
  if (!text) {
    fprintf(stderr, "tessera plan: cannot read the profile '%s'\n", a->profile);
    return TSR_ERR_INPUT;
  }
  char **hw = tsr_calloc((size_t)a->n_over + 1, sizeof *hw);
  int n = 0, rc = TSR_ERR;
  if (hw) {
    for (int i = 0; i < a->n_over; i++) {
      const char *o = a->over[i];
      while (*o == ' ') o++;
      if (!strncasecmp(o, "hardware.", 9)) hw[n++] = a->over[i];
    }
    tsr_config pc;
    rc = tsr_deck_parse(&pc, text, len, a->profile, n, hw, 1, err, sizeof err);
    if (rc) fputs(err, stderr);
    else cfg->hardware = pc.hardware;
  }
  free(text);
  tsr_free(&hw);
  return rc;
}

/* The deck on this machine: a first reading finds &hardware (so the GPUs per node, so the
 * world size); the second checks the deck against that world.  A search replaces the
 * layout, so it only needs the deck to be valid on its own tp x cp x pp ranks, or else with
 * the keys it varies and the command line does not hold set aside (*deck_invalid). */
static int load(plan_args *a, tsr_config *cfg, tsr_hardware *hw, int *world) {
  size_t len = 0;
  char *text = read_text(a->deck, &len), err[16384];
  if (!text) {
    fprintf(stderr, "%s: cannot read the deck\n", a->deck);
    return TSR_ERR_INPUT;
  }
  tsr_deck_parse(cfg, text, len, a->deck, a->n_over, a->over, 1, err, sizeof err);
  int rc = apply_profile(a, cfg);
  if (!rc) rc = tsr_plan_hardware(&cfg->hardware, hw);
  if (!rc) rc = world_size(a->nodes, hw, world);
  const int64_t own64 = cfg->parallel.tp * (cfg->parallel.cp > 1 ? cfg->parallel.cp : 1) *
                        cfg->parallel.pp;
  const int own = own64 > 0 && own64 <= INT_MAX ? (int)own64 : 0;
  if (!rc) {
    rc = tsr_deck_parse(cfg, text, len, a->deck, a->n_over, a->over, *world, err, sizeof err);
    if (rc && a->search && own > 0)
      rc = tsr_deck_parse(cfg, text, len, a->deck, a->n_over, a->over, own, err, sizeof err);
    if (rc && a->search && !parse_neutral(a, text, len, cfg)) rc = 0, a->deck_invalid = 1;
    if (rc) fputs(err, stderr);
    if (!rc) rc = apply_profile(a, cfg);
  }
  free(text);
  return rc;
}

/* One plan; *fits: whether it fits. */
static int plan_one(const tsr_config *cfg, const tsr_hardware *hw, int nodes, int world,
                    int json, int *fits) {
  char msg[8192];
  tsr_plan_grid g;
  const int bad = tsr_plan_layout(cfg, world, hw->gpus_per_node, &g, msg, sizeof msg);
  if (bad) {
    fprintf(stderr, "tessera plan: the layout does not divide on %d node(s) x %d GPUs (%d "
            "problem%s):\n%s", nodes, hw->gpus_per_node, bad, bad > 1 ? "s" : "", msg);
    return TSR_ERR_INPUT;
  }
  tsr_plan p;
  const int rc = tsr_plan_make(&p, cfg, hw, &g, 1);
  if (!rc && json) tsr_plan_print_json(stdout, &p, cfg, nodes);
  if (!rc && !json) tsr_plan_print(stdout, &p, cfg, nodes);
  *fits = !rc && p.fits;
  tsr_plan_destroy(&p);
  return rc;
}

int tsr_plan_main(int argc, char **argv) {
  plan_args a;
  int rc = parse_args(argc, argv, &a);
  if (!rc && a.help) plan_usage(stdout);
  if (!rc && !a.help) {
    tsr_config cfg;
    tsr_hardware hw;
    int world = 0, fits = 0;
    rc = load(&a, &cfg, &hw, &world);
    hw.max_mem_frac = a.max_mem_frac;
    char why[512];
    /* dp = world / (tp cp pp): a cp rank's sequences are those of its dp rank */
    const long long tpp = (long long)cfg.parallel.tp * cfg.parallel.pp *
                          (cfg.parallel.cp > 1 ? cfg.parallel.cp : 1);
    if (!rc && !a.print_profile &&
        tsr_batch_tokens_warning(&cfg, a.search || tpp < 1 ? 0 : world / tpp, why, sizeof why))
      fprintf(a.json ? stderr : stdout, "warning: %s\n", why);
    if (!rc && a.print_profile) {
      tsr_plan_profile_print(stdout, &hw);
    } else if (!rc && a.search) {
      const tsr_plan_search_opts o = {a.nodes, a.top, a.json, a.fixed, a.deck_invalid};
      rc = tsr_plan_search(&cfg, &hw, &o, &fits);
    } else if (!rc) {
      rc = plan_one(&cfg, &hw, a.nodes, world, a.json, &fits);
    }
    if (!rc && a.require_fit && !fits) {
      fprintf(stderr, "tessera plan: %s (--require-fit): exit %d\n",
              a.search ? "no layout fits" : "the plan does not fit", TSR_PLAN_NO_FIT);
      rc = TSR_PLAN_NO_FIT;
    }
  }
  tsr_free(&a.over);
  fflush(stdout);
  return rc;
}
