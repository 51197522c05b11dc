/* grid.c — the tp x cp x dp x pp process grid: layout checks, node detection, the
 * communicators of grid.h, and the layout table rank 0 logs.
 *
 * Every layout check is computed by every rank from the same inputs (the broadcast
 * config, the world size and, when detected, the node map that all ranks gathered), so
 * all ranks reach the same verdict and return together: a bad layout never leaves a rank
 * waiting in a collective.  Only rank 0 prints the message. */
#include "grid.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "comm_dev.h"
#include "comm_mpi.h"
#include "deck/deck.h"
#include "sched/pipeline.h"
#include "core/util.h"

/* One message from rank 0; every rank returns TSR_ERR_INPUT. */
static int layout_error(int rank, const char *fmt, ...) TSR_PRINTF(2, 3);
static int layout_error(int rank, const char *fmt, ...) {
  if (rank == 0) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tsr_error("bad parallel layout: %s", msg);
  }
  return TSR_ERR_INPUT;
}

/* Ranks per node from MPI_COMM_TYPE_SHARED.  Every rank learns every rank's node (the
 * lowest world rank on it), then checks that nodes are equal, consecutive blocks. */
static int detect_nodes(const tsr_comm *world, int *ranks_per_node) {
  MPI_Comm w = tsr_comm_mpi(world), shm;
  int rank = tsr_comm_rank(world), size = tsr_comm_size(world);
  TSR_MPI_CALL(MPI_Comm_split_type(w, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm));
  int leader = rank; /* key = world rank, so local rank 0 is the node's lowest world rank */
  int rc = MPI_Bcast(&leader, 1, MPI_INT, 0, shm);
  MPI_Comm_free(&shm);
  if (rc != MPI_SUCCESS) {
    tsr_mpi_error(__FILE__, __LINE__, __func__, "MPI_Bcast(&leader, ..., shm)", rc);
    return TSR_ERR;
  }
  int *leaders = tsr_calloc((size_t)size, sizeof(int));
  TSR_CHECK(leaders, TSR_ERR, "out of memory for the node map of %d ranks", size);
  rc = MPI_Allgather(&leader, 1, MPI_INT, leaders, 1, MPI_INT, w);
  if (rc != MPI_SUCCESS) {
    tsr_free(&leaders);
    tsr_mpi_error(__FILE__, __LINE__, __func__, "MPI_Allgather(&leader, ...)", rc);
    return TSR_ERR;
  }
  int rpn = 0;
  while (rpn < size && leaders[rpn] == 0) rpn++;
  rc = 0;
  if (size % rpn) {
    rc = layout_error(rank,
                      "the first node holds %d ranks, which does not divide the world size %d: "
                      "start the same number of ranks on every node, or set &parallel "
                      "ranks_per_node", rpn, size);
  } else {
    for (int r = 0; r < size && !rc; r++) {
      if (leaders[r] != r / rpn * rpn)
        rc = layout_error(rank,
                          "world rank %d shares a node with world rank %d, but every node must "
                          "hold %d consecutive ranks (as the first node does): place ranks in "
                          "blocks (mpirun --map-by slot, srun --distribution=block), or set "
                          "&parallel ranks_per_node", r, leaders[r], rpn);
    }
  }
  tsr_free(&leaders);
  *ranks_per_node = rpn;
  return rc;
}

/* shard_size for shard_scope 'node': the ranks of a dp group on one node must form equal
 * runs, the same for every dp group. */
static int node_shard_size(const tsr_grid *g, int *shard) {
  int want = 0;
  for (int p = 0; p < g->pp; p++) {
    for (int t = 0; t < g->tp; t++) {
      int run = 0, run_node = -1;
      for (int d = 0; d <= g->dpcp; d++) {
        int n = d < g->dpcp ? (p * g->dpcp * g->tp + d * g->tp + t) / g->ranks_per_node : -1;
        if (n == run_node) {
          run++;
          continue;
        }
        if (run_node >= 0) {
          if (!want) want = run;
          if (run != want)
            return layout_error(
                g->world_rank,
                "parallel.shard_scope = 'node' needs every dp group spread evenly over nodes, "
                "but the dp group of pp rank %d, tp rank %d has %d ranks on node %d where "
                "others have %d (dp x cp %d x tp %d = %d ranks per pipeline stage, %d ranks "
                "per node; one must divide the other): use shard_scope 'global' or a number",
                p, t, run, run_node, want, g->dpcp, g->tp, g->dpcp * g->tp, g->ranks_per_node);
        }
        run_node = n;
        run = 1;
      }
    }
  }
  *shard = want;
  return 0;
}

static int check_layout(tsr_grid *g, const tsr_grid_spec *spec, const tsr_comm *world) {
  const tsr_parallel_config *pc = &spec->parallel;
  const int rank = g->world_rank, ws = g->world_size;
  g->ranks_per_node_from_deck = pc->ranks_per_node > 0;
  if (g->ranks_per_node_from_deck)
    g->ranks_per_node = (int)pc->ranks_per_node;
  else
    TSR_CALL(detect_nodes(world, &g->ranks_per_node));
  /* the rules the deck and the planner apply too (layout_check.c), now with the world size
   * and the nodes known */
  char text[1024];
  if (spec->check && spec->check(spec->check_ctx, ws, g->ranks_per_node, text, sizeof text))
    return layout_error(rank, "%s%s", text,
                        g->ranks_per_node_from_deck ? "" : " (ranks per node as detected)");
  g->tp = (int)pc->tp;
  g->pp = (int)pc->pp;
  g->cp = pc->cp > 1 ? (int)pc->cp : 1;
  g->dp = ws / (g->tp * g->cp * g->pp);
  g->dpcp = g->dp * g->cp;
  g->n_nodes = ws / g->ranks_per_node;
  g->shard_scope = pc->shard_scope;
  if (pc->shard_scope == TSR_SHARD_GLOBAL)
    g->shard_size = g->dpcp;
  else if (pc->shard_scope == TSR_SHARD_NODE)
    TSR_CALL(node_shard_size(g, &g->shard_size)); /* from where the ranks of dp groups are */
  else
    g->shard_size = (int)pc->shard_scope;
  g->replicate_size = g->dpcp / g->shard_size;
  return 0;
}

static int split(tsr_comm **out, const tsr_comm *world, int color, int key, const char *name) {
  MPI_Comm sub;
  TSR_MPI_CALL(MPI_Comm_split(tsr_comm_mpi(world), color, key, &sub));
  int rc = tsr_comm_create(out, sub, name);
  MPI_Comm_free(&sub);
  return rc;
}

static int expect_group(const tsr_comm *c, int size, int rank) {
  TSR_CHECK(c && tsr_comm_size(c) == size && tsr_comm_rank(c) == rank, TSR_ERR,
            "internal: communicator '%s' is rank %d of %d, expected %d of %d",
            c ? tsr_comm_name(c) : "?", c ? tsr_comm_rank(c) : -1, c ? tsr_comm_size(c) : -1,
            rank, size);
  return 0;
}

static int build(tsr_grid *g, const tsr_comm *world) {
  /* the dp x cp ranks of a (pp, tp) position play the part dp plays without cp */
  const int w = g->world_rank, tp = g->tp, dp = g->dpcp;
  g->tp_rank = w % tp;
  g->dpcp_rank = w / tp % dp;
  g->cp_rank = g->dpcp_rank % g->cp;
  g->dp_rank = g->dpcp_rank / g->cp;
  g->pp_rank = w / (tp * dp);
  g->node = w / g->ranks_per_node;
  g->local_rank = w % g->ranks_per_node;
  g->shard_rank = g->dpcp_rank % g->shard_size;
  g->replicate_rank = g->dpcp_rank / g->shard_size;
  /* Colours number the groups in the order tsr_grid_log lists them. */
  const int column = g->pp_rank * tp + g->tp_rank; /* which dp group */
  TSR_CALL(split(&g->world, world, 0, w, "world"));
  TSR_CALL(split(&g->tp_comm, world, g->pp_rank * dp + g->dpcp_rank, g->tp_rank, "tp"));
  TSR_CALL(split(&g->pp_comm, world, g->dpcp_rank * tp + g->tp_rank, g->pp_rank, "pp"));
  TSR_CALL(split(&g->dp_comm, world, column, g->dpcp_rank, g->cp > 1 ? "dp_cp" : "dp"));
  TSR_CALL(split(&g->cp_comm, world, (g->pp_rank * g->dp + g->dp_rank) * tp + g->tp_rank,
                 g->cp_rank, "cp"));
  TSR_CALL(split(&g->dp_shard, world, column * g->replicate_size + g->replicate_rank,
                 g->shard_rank, "dp_shard"));
  TSR_CALL(split(&g->dp_replicate, world, column * g->shard_size + g->shard_rank,
                 g->replicate_rank, "dp_replicate"));
  TSR_CALL(split(&g->node_comm, world, g->node, g->local_rank, "node"));
  return 0;
}

/* The pair of first and last stage that holds the two copies of a tied embedding. */
static int build_tied(tsr_grid *g, const tsr_grid_spec *spec, const tsr_comm *world) {
  const int head = tsr_pp_head_stage(spec->parallel.schedule, g->pp,
                                     (int)spec->parallel.virtual_stages);
  if (!spec->tie_embeddings || head == 0) return 0; /* one stage holds both */
  const int ends = g->pp_rank == 0 || g->pp_rank == head;
  MPI_Comm c;
  TSR_MPI_CALL(MPI_Comm_split(tsr_comm_mpi(world),
                              ends ? g->dpcp_rank * g->tp + g->tp_rank : MPI_UNDEFINED, g->pp_rank,
                              &c));
  if (!ends) return 0;
  const int rc = tsr_comm_create(&g->embed_tied, c, "embed_tied");
  MPI_Comm_free(&c);
  return rc;
}

/* Each group has the size and this rank the position the formulas say.  A mismatch is a
 * bug, not bad input; the ranks agree on the verdict so none is left in a collective. */
static int verify(const tsr_grid *g, const tsr_comm *world) {
  int rc = expect_group(g->world, g->world_size, g->world_rank);
  rc |= expect_group(g->tp_comm, g->tp, g->tp_rank);
  rc |= expect_group(g->pp_comm, g->pp, g->pp_rank);
  rc |= expect_group(g->dp_comm, g->dpcp, g->dpcp_rank);
  rc |= expect_group(g->cp_comm, g->cp, g->cp_rank);
  rc |= expect_group(g->dp_shard, g->shard_size, g->shard_rank);
  rc |= expect_group(g->dp_replicate, g->replicate_size, g->replicate_rank);
  rc |= expect_group(g->node_comm, g->ranks_per_node, g->local_rank);
  TSR_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, tsr_comm_mpi(world)));
  return rc ? TSR_ERR : 0;
}

int tsr_grid_create(tsr_grid **out, const tsr_grid_spec *spec, const tsr_comm *world) {
  *out = NULL;
  tsr_grid *g = tsr_calloc(1, sizeof *g);
  TSR_CHECK(g, TSR_ERR, "out of memory for the grid");
  g->world_rank = tsr_comm_rank(world);
  g->world_size = tsr_comm_size(world);
  int rc = check_layout(g, spec, world);
  if (!rc) rc = build(g, world);
  if (!rc) rc = verify(g, world);
  if (!rc) rc = build_tied(g, spec, world);
  if (rc) {
    tsr_grid_destroy(&g);
    return rc;
  }
  *out = g;
  return 0;
}

void tsr_grid_destroy(tsr_grid **gp) {
  if (!gp || !*gp) return;
  tsr_grid *g = *gp;
  tsr_comm_destroy(&g->embed_tied);
  tsr_comm_destroy(&g->node_comm);
  tsr_comm_destroy(&g->dp_replicate);
  tsr_comm_destroy(&g->dp_shard);
  tsr_comm_destroy(&g->cp_comm);
  tsr_comm_destroy(&g->dp_comm);
  tsr_comm_destroy(&g->pp_comm);
  tsr_comm_destroy(&g->tp_comm);
  tsr_comm_destroy(&g->world);
  /* after every group that used them */
  if (g->nccl_used) tsr_comm_gpu_transport->close();
  if (g->staged_used) tsr_comm_staged_transport->close();
  tsr_free(gp);
}

int tsr_grid_attach_device(tsr_grid *g, const tsr_parallel_config *pc,
                           tsr_comm *const *zero_groups, int n_zero) {
  const int across = pc->inter_node == TSR_INTER_NODE_NCCL;
  /* every rank takes the same path (attaching is collective): CUDA-aware only if all are */
  int aware = tsr_comm_mpi_cuda_aware();
  TSR_CALL(tsr_comm_all_reduce_int(g->world, &aware, 1, TSR_COMM_MIN));
  const int staged = tsr_comm_staged_transport &&
                     (pc->mpi_gpu == TSR_MPI_GPU_STAGED ||
                      (pc->mpi_gpu == TSR_MPI_GPU_AUTO && aware != 1));
  tsr_comm *grp[9] = {g->tp_comm};
  int n = 1;
  for (int i = 0; i < n_zero && n < 6; i++) grp[n++] = zero_groups[i];
  grp[n++] = g->embed_tied;
  const int pp = n; /* the point-to-point groups last: the pipeline's and the cp ring's */
  grp[n++] = g->pp_comm;
  grp[n++] = g->cp_comm;
  char line[512] = "";
  size_t used = 0;
  const char *direct = NULL; /* a group handed to MPI on device memory, MPI not CUDA-aware */
  for (int i = 0; i < n; i++) {
    int seen = 0, spans = 0;
    for (int j = 0; j < i; j++) seen |= grp[j] == grp[i];
    if (!grp[i] || seen || tsr_comm_size(grp[i]) == 1) continue;
    TSR_CALL(tsr_grid_spans_nodes(g, grp[i], &spans));
    if (tsr_comm_gpu_transport && i < pp && (!spans || across)) {
      TSR_CALL(tsr_comm_attach_device(grp[i], tsr_comm_gpu_transport));
      g->nccl_used = 1;
    }
    if (staged && !strcmp(tsr_comm_backend(grp[i]), "mpi")) {
      TSR_CALL(tsr_comm_attach_device(grp[i], tsr_comm_staged_transport));
      g->staged_used = 1;
    }
    /* MPI on device memory itself: only an MPI that reads device memory can */
    if (aware == 0 && !strcmp(tsr_comm_backend(grp[i]), "mpi") && !direct)
      direct = tsr_comm_name(grp[i]);
    if (used < sizeof line)
      used += (size_t)snprintf(line + used, sizeof line - used, "%s%s %s%s", used ? ", " : "",
                               tsr_comm_name(grp[i]), tsr_comm_backend(grp[i]),
                               spans ? " (across nodes)" : "");
  }
  /* agreed: the groups that span nodes, and so their transports, differ between ranks */
  int bad = direct != NULL;
  TSR_CALL(tsr_comm_all_reduce_int(g->world, &bad, 1, TSR_COMM_MAX));
  if (bad) {
    if (direct)
      tsr_error("parallel.mpi_gpu = '%s' hands group '%s' device memory through MPI, and this "
                "MPI is not CUDA-aware (MPIX_Query_cuda_support): set parallel.mpi_gpu = "
                "'staged' or 'auto' (pinned host copies)",
                tsr_deck_choice_word("parallel.mpi_gpu", pc->mpi_gpu), direct);
    return TSR_ERR_INPUT;
  }
  if (used)
    tsr_log("comm: %s; inter_node = '%s', mpi_gpu = '%s' (MPI %s)", line,
            tsr_deck_choice_word("parallel.inter_node", pc->inter_node), tsr_deck_choice_word("parallel.mpi_gpu", pc->mpi_gpu),
            aware == 1   ? "is CUDA-aware"
            : aware == 0 ? "is not CUDA-aware"
                         : "cannot say if it is CUDA-aware");
  return 0;
}

/* The groups whose traffic is logged, in a fixed order. */
enum { N_LOGGED = 7 };
static void logged_groups(const tsr_grid *g, tsr_comm *out[N_LOGGED]) {
  out[0] = g->dp_comm, out[1] = g->dp_shard, out[2] = g->dp_replicate;
  out[3] = g->tp_comm, out[4] = g->pp_comm, out[5] = g->world, out[6] = g->cp_comm;
}

void tsr_grid_reset_traffic(tsr_grid *g) {
  tsr_comm *c[N_LOGGED];
  logged_groups(g, c);
  for (int i = 0; i < N_LOGGED; i++) tsr_comm_reset_counters(c[i]);
}

void tsr_grid_describe_traffic(const tsr_grid *g, char *buf, size_t len) {
  tsr_comm *c[N_LOGGED];
  logged_groups(g, c);
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < N_LOGGED && used < len; i++) {
    if (tsr_comm_bytes(c[i]) <= 0 || (i > 0 && c[i] == c[0])) continue;
    used += (size_t)snprintf(buf + used, len - used, "%s%s %.3f MB (", used ? "; " : "",
                             tsr_comm_name(c[i]), tsr_comm_bytes(c[i]) / 1e6);
    int first = 1;
    for (int k = 0; k < TSR_COMM_N_KINDS && used < len; k++) {
      const double b = tsr_comm_bytes_of(c[i], (tsr_comm_kind)k);
      if (b <= 0) continue;
      used += (size_t)snprintf(buf + used, len - used, "%s%s %.3f", first ? "" : ", ",
                               tsr_comm_kind_name((tsr_comm_kind)k), b / 1e6);
      first = 0;
    }
    if (used < len) used += (size_t)snprintf(buf + used, len - used, ")");
  }
  if (!buf[0]) snprintf(buf, len, "none");
}

/* ------------------------------------------------------------------ the layout table */

enum { K_TP, K_CP, K_PP, K_DP, K_SHARD, K_REPLICATE, K_NODE, N_KINDS };
static const char *group_names[N_KINDS] = {"tp", "cp", "pp", "dp", "dp_shard", "dp_replicate",
                                           "node"};

/* In the table, "dp" is the dp x cp group (dp_comm) */
static int group_count(const tsr_grid *g, int kind) {
  switch (kind) {
  case K_TP: return g->pp * g->dpcp;
  case K_CP: return g->pp * g->dp * g->tp;
  case K_PP: return g->dpcp * g->tp;
  case K_DP: return g->pp * g->tp;
  case K_SHARD: return g->pp * g->tp * g->replicate_size;
  case K_REPLICATE: return g->pp * g->tp * g->shard_size;
  default: return g->n_nodes;
  }
}

static int group_size(const tsr_grid *g, int kind) {
  switch (kind) {
  case K_TP: return g->tp;
  case K_CP: return g->cp;
  case K_PP: return g->pp;
  case K_DP: return g->dpcp;
  case K_SHARD: return g->shard_size;
  case K_REPLICATE: return g->replicate_size;
  default: return g->ranks_per_node;
  }
}

/* World rank of member j of group i, groups numbered as the split colours in build(). */
static int member(const tsr_grid *g, int kind, int i, int j) {
  const int tp = g->tp, dp = g->dpcp, S = g->shard_size, R = g->replicate_size;
  switch (kind) {
  case K_TP: return (i / dp) * dp * tp + (i % dp) * tp + j;
  case K_CP: /* group i = (pp rank * data dp + dp rank) * tp + tp rank */
    return (i / tp / g->dp) * dp * tp + ((i / tp % g->dp) * g->cp + j) * tp + i % tp;
  case K_PP: return j * dp * tp + (i / tp) * tp + i % tp;
  case K_DP: return (i / tp) * dp * tp + j * tp + i % tp;
  case K_SHARD: {
    int column = i / R, d = (i % R) * S + j;
    return (column / tp) * dp * tp + d * tp + column % tp;
  }
  case K_REPLICATE: {
    int column = i / S, d = j * S + i % S;
    return (column / tp) * dp * tp + d * tp + column % tp;
  }
  default: return i * g->ranks_per_node + j;
  }
}

enum { SHOW_GROUPS = 16, SHOW_MEMBERS = 8, LINE_WIDTH = 100 };

/* Appends to a line and logs it when full; continuation lines are indented. */
typedef struct {
  char buf[512];
  size_t len;
} line;

static void emit(line *l, const char *piece) {
  size_t n = strlen(piece);
  if (l->len + n + 1 > LINE_WIDTH && l->len > 30) {
    tsr_log("%s", l->buf);
    l->len = (size_t)snprintf(l->buf, sizeof l->buf, "grid: %28s", "");
  }
  l->len += (size_t)snprintf(l->buf + l->len, sizeof l->buf - l->len, " %s", piece);
  if (l->len >= sizeof l->buf) l->len = sizeof l->buf - 1;
}

/* A sequence given by element(k), k < n, written compactly: "0,1,2" when short,
 * "0-7" or "0,8,…,56" when evenly spaced, else the first SHOW_MEMBERS then "…(n)". */
typedef int (*element_fn)(const tsr_grid *g, int kind, int i, int k);

static size_t format_seq(char *s, size_t len, const tsr_grid *g, int kind, int i, int n,
                         element_fn element) {
  int even = n >= 4;
  for (int k = 2; k < n && even; k++)
    even = element(g, kind, i, k) - element(g, kind, i, k - 1) ==
           element(g, kind, i, 1) - element(g, kind, i, 0);
  if (even && element(g, kind, i, 1) - element(g, kind, i, 0) == 1)
    return (size_t)snprintf(s, len, "%d-%d", element(g, kind, i, 0), element(g, kind, i, n - 1));
  if (even)
    return (size_t)snprintf(s, len, "%d,%d,…,%d", element(g, kind, i, 0),
                            element(g, kind, i, 1), element(g, kind, i, n - 1));
  size_t k = 0;
  for (int j = 0; j < n && j < SHOW_MEMBERS && k < len; j++)
    k += (size_t)snprintf(s + k, len - k, "%s%d", j ? "," : "", element(g, kind, i, j));
  if (n > SHOW_MEMBERS && k < len) k += (size_t)snprintf(s + k, len - k, ",…(%d)", n);
  return k;
}

static int node_of_member(const tsr_grid *g, int kind, int i, int k) {
  return member(g, kind, i, k) / g->ranks_per_node;
}

/* The j-th distinct node of group i, in member order (members are in increasing rank
 * order, so a node's members are adjacent). */
static int nth_node(const tsr_grid *g, int kind, int i, int j) {
  int seen = 0, last = -1;
  for (int k = 0; k < group_size(g, kind); k++) {
    int n = node_of_member(g, kind, i, k);
    if (n != last && seen++ == j) return n;
    last = n;
  }
  return last;
}

static int distinct_nodes(const tsr_grid *g, int kind, int i) {
  int count = 0, last = -1;
  for (int k = 0; k < group_size(g, kind); k++) {
    int n = node_of_member(g, kind, i, k);
    count += n != last;
    last = n;
  }
  return count;
}

/* "{0-3}@n0" on one node; "{0@n0,4@n1}" for a small group over nodes; for a larger one
 * the members and the nodes they span, "{0,512,…,3584}@n{0,64,…,448}". */
static void format_group(const tsr_grid *g, int kind, int i, char *s, size_t len) {
  const int n = group_size(g, kind), nodes = distinct_nodes(g, kind, i);
  size_t k;
  if (nodes > 1 && n <= 4) {
    k = (size_t)snprintf(s, len, "{");
    for (int j = 0; j < n && k < len; j++) {
      int r = member(g, kind, i, j);
      k += (size_t)snprintf(s + k, len - k, "%s%d@n%d", j ? "," : "", r, r / g->ranks_per_node);
    }
    if (k < len) snprintf(s + k, len - k, "}");
    return;
  }
  k = (size_t)snprintf(s, len, "{");
  if (k < len) k += format_seq(s + k, len - k, g, kind, i, n, member);
  if (k < len && nodes == 1) {
    snprintf(s + k, len - k, "}@n%d", node_of_member(g, kind, i, 0));
  } else if (k < len) {
    k += (size_t)snprintf(s + k, len - k, "}@n{");
    if (k < len) k += format_seq(s + k, len - k, g, kind, i, nodes, nth_node);
    if (k < len) snprintf(s + k, len - k, "}");
  }
}

void tsr_grid_log(const tsr_grid *g) {
  if (!g || g->world_rank != 0) return;
  char cpx[32] = "";
  if (g->cp > 1) snprintf(cpx, sizeof cpx, " x cp %d", g->cp);
  tsr_log("grid: world %d = tp %d%s x dp %d x pp %d on %d node%s x %d ranks (%s)", g->world_size,
          g->tp, cpx, g->dp, g->pp, g->n_nodes, g->n_nodes == 1 ? "" : "s", g->ranks_per_node,
          g->ranks_per_node_from_deck ? "parallel.ranks_per_node" : "detected");
  char scope[32];
  if (g->cp > 1)
    tsr_log("grid: dp %d x cp %d = %d ranks hold each parameter (the dp row below) = dp_shard %d "
            "x dp_replicate %d (shard_scope '%s')", g->dp, g->cp, g->dpcp, g->shard_size,
            g->replicate_size, tsr_shard_scope_text(g->shard_scope, scope, 32));
  else
    tsr_log("grid: dp %d = dp_shard %d x dp_replicate %d (shard_scope '%s')", g->dp,
            g->shard_size, g->replicate_size, tsr_shard_scope_text(g->shard_scope, scope, 32));
  tsr_log("grid: %-12s %15s world ranks{…}@node", "group", "groups x size  ");
  for (int kind = 0; kind < N_KINDS; kind++) {
    if (kind == K_CP && g->cp == 1) continue;
    const int n = group_count(g, kind), shown = n < SHOW_GROUPS ? n : SHOW_GROUPS;
    line l;
    l.len = (size_t)snprintf(l.buf, sizeof l.buf, "grid: %-12s %6d x %-6d ", group_names[kind],
                             n, group_size(g, kind));
    for (int i = 0; i < shown; i++) {
      char s[256];
      format_group(g, kind, i, s, sizeof s);
      emit(&l, s);
    }
    if (shown < n) {
      char s[64];
      snprintf(s, sizeof s, "… (%d more)", n - shown);
      emit(&l, s);
    }
    tsr_log("%s", l.buf);
  }
}

int tsr_grid_spans_nodes(const tsr_grid *g, tsr_comm *c, int *spans) {
  *spans = 0;
  if (!c || tsr_comm_size(c) == 1) return 0;
  int lo_hi[2] = {g->node, -g->node}; /* min and -max of the nodes in one call */
  TSR_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, lo_hi, 2, MPI_INT, MPI_MIN, tsr_comm_mpi(c)));
  *spans = lo_hi[0] != -lo_hi[1];
  return 0;
}
