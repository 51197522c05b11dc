/* test_grid.c — the process grid against closed forms (MPI test; run by grid_comm.sh on
 * 1, 2, 4 and 8 ranks with several layouts).
 *
 *   test_grid [tp=T] [pp=P] [rpn=R] [scope=global|node|N] [mb=M] [gb=G]
 *             [expect_rc=0|2] [nodes=N] [shard=S] [log=1] [fake_world=W]
 *
 * With expect_rc=0 it checks, on every rank, the rank -> (tp, dp, pp) formula, that each
 * communicator holds exactly the world ranks a closed form gives (in rank order), the
 * node split, dp_shard x dp_replicate, that tp groups stay inside a node, and that a
 * collective over each group sums the closed-form members.  `nodes` and, for
 * scope=node, `shard` are the expected node count and dp_shard size worked out by hand.
 * With expect_rc=2 it checks that tsr_grid_create failed with 2 on every rank and exits
 * 2 (grid_comm.sh checks the single message).  fake_world=W logs the table of a
 * synthetic W-rank grid without creating it (for the compactness check).
 * Results are reduced over all ranks; rank 0 prints PASS/FAIL; exit 1 on any failure. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#if defined(MPI_VERSION) || defined(OMPI_MPI_H)
#error "comm.h must not include mpi.h (model code includes it)"
#endif
#include "comm/grid.h"
#if defined(MPI_VERSION) || defined(OMPI_MPI_H)
#error "grid.h must not include mpi.h (model code includes it)"
#endif

#include <mpi.h>

#include "comm/comm_mpi.h"
#include "deck/deck.h"
#include "mpicheck.h"
#include "core/util.h"

/* The world ranks of c's members in c's rank order. */
static void members(const tsr_comm *c, int *out) {
  MPI_Group grp, wgrp;
  int n = tsr_comm_size(c);
  int *idx = malloc(sizeof(int) * (size_t)n);
  for (int i = 0; i < n; i++) idx[i] = i;
  MPI_Comm_group(tsr_comm_mpi(c), &grp);
  MPI_Comm_group(MPI_COMM_WORLD, &wgrp);
  MPI_Group_translate_ranks(grp, n, idx, wgrp, out);
  MPI_Group_free(&grp);
  MPI_Group_free(&wgrp);
  free(idx);
}

/* c holds exactly want[0..n) in that order, this rank sits where it should, and a sum
 * over c of the world ranks equals the closed-form sum. */
static int group_is(tsr_comm *c, const int *want, int n, int w) {
  if (tsr_comm_size(c) != n) return 0;
  int *got = malloc(sizeof(int) * (size_t)n), ok = 1;
  members(c, got);
  long sum = 0;
  for (int i = 0; i < n; i++) {
    ok &= got[i] == want[i];
    if (want[i] == w) ok &= tsr_comm_rank(c) == i;
    sum += want[i];
  }
  free(got);
  int x = w;
  if (tsr_comm_all_reduce_int(c, &x, 1, TSR_COMM_SUM) != 0) return 0;
  return ok && x == sum;
}

static const char *arg(int argc, char **argv, const char *key, const char *def) {
  size_t n = strlen(key);
  for (int i = 1; i < argc; i++)
    if (!strncmp(argv[i], key, n) && argv[i][n] == '=') return argv[i] + n + 1;
  return def;
}

/* The layout table of a synthetic large grid (only rank 0 logs). */
static void log_fake(int ws, int tp, int pp, int rpn, int shard) {
  tsr_grid g;
  memset(&g, 0, sizeof g);
  g.world_size = ws;
  g.tp = tp;
  g.pp = pp;
  g.dp = ws / (tp * pp);
  g.ranks_per_node = rpn;
  g.n_nodes = ws / rpn;
  g.ranks_per_node_from_deck = 1;
  g.shard_size = shard;
  g.replicate_size = g.dp / shard;
  g.shard_scope = shard;
  tsr_grid_log(&g);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int ws;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ws);
  tsr_set_rank(g_rank);

  tsr_config cfg;
  tsr_deck_defaults(&cfg);
  /* a model every grid here divides (up to tp 8, pp 8) */
  cfg.model.n_layer = 8, cfg.model.d_model = 128, cfg.model.n_head = 8, cfg.model.n_kv_head = 8;
  cfg.model.d_ff = 256, cfg.model.vocab_size = 256;
  cfg.parallel.tp = atoi(arg(argc, argv, "tp", "1"));
  cfg.parallel.pp = atoi(arg(argc, argv, "pp", "1"));
  cfg.parallel.ranks_per_node = atoi(arg(argc, argv, "rpn", "0"));
  const char *scope = arg(argc, argv, "scope", "global");
  cfg.parallel.shard_scope = !strcmp(scope, "global") ? TSR_SHARD_GLOBAL
                             : !strcmp(scope, "node") ? TSR_SHARD_NODE
                                                      : atoi(scope);
  cfg.train.micro_batch = atoi(arg(argc, argv, "mb", "1"));
  cfg.train.global_batch = atoi(arg(argc, argv, "gb", "16"));
  const int expect_rc = atoi(arg(argc, argv, "expect_rc", "0"));

  const int fake_world = atoi(arg(argc, argv, "fake_world", "0"));
  if (fake_world) {
    log_fake(fake_world, (int)cfg.parallel.tp, (int)cfg.parallel.pp,
             (int)cfg.parallel.ranks_per_node, atoi(arg(argc, argv, "shard", "1")));
    MPI_Finalize();
    return 0;
  }

  if (g_rank == 0)
    printf("test_grid: %d ranks, tp %lld pp %lld ranks_per_node %lld shard_scope '%s' "
           "micro_batch %lld global_batch %lld\n", ws, (long long)cfg.parallel.tp,
           (long long)cfg.parallel.pp, (long long)cfg.parallel.ranks_per_node,
           scope, (long long)cfg.train.micro_batch,
           (long long)cfg.train.global_batch);

  tsr_comm *world = NULL;
  if (tsr_comm_create(&world, MPI_COMM_WORLD, "test-world")) MPI_Abort(MPI_COMM_WORLD, 1);
  tsr_grid *g = NULL;
  tsr_grid_spec gs;
  tsr_grid_spec_of(&gs, &cfg);
  int rc = tsr_grid_create(&g, &gs, world);
  int rc_min = rc, rc_max = rc;
  MPI_Allreduce(MPI_IN_PLACE, &rc_min, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &rc_max, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  check(rc_min == expect_rc && rc_max == expect_rc,
        "tsr_grid_create returned %d on every rank (got %d..%d)", expect_rc, rc_min, rc_max);
  if (expect_rc != 0 || rc_max != 0) { /* decided on the reduced codes: every rank agrees */
    check((g == NULL) == (rc != 0), "a failed create leaves the grid NULL");
    tsr_grid_destroy(&g);
    tsr_comm_destroy(&world);
    MPI_Finalize();
    return n_fail ? 1 : rc;
  }
  if (atoi(arg(argc, argv, "log", "0"))) tsr_grid_log(g);

  /* The closed forms, from the world rank alone. */
  const int w = g_rank, tp = (int)cfg.parallel.tp, pp = (int)cfg.parallel.pp;
  const int dp = ws / (tp * pp);
  const int t = w % tp, d = (w / tp) % dp, p = w / (tp * dp);
  const int rpn = cfg.parallel.ranks_per_node > 0 ? (int)cfg.parallel.ranks_per_node : ws;
  const int n_nodes = atoi(arg(argc, argv, "nodes", "1"));
  const int S = !strcmp(scope, "global") ? dp
                : !strcmp(scope, "node") ? atoi(arg(argc, argv, "shard", "0"))
                                         : atoi(scope);
  const int R = S > 0 ? dp / S : 0;

  check(g->world_size == ws && g->world_rank == w, "world size %d, ranks in world order", ws);
  check(g->tp == tp && g->pp == pp && g->dp == dp, "dp = %d / (tp %d x pp %d) = %d", ws, tp, pp,
        dp);
  check(g->tp_rank == t && g->dp_rank == d && g->pp_rank == p,
        "rank -> (tp, dp, pp) = (w %% tp, w / tp %% dp, w / (tp dp))");
  check(g->world_rank == g->pp_rank * (g->dp * g->tp) + g->dp_rank * g->tp + g->tp_rank,
        "world rank = pp_rank*(dp*tp) + dp_rank*tp + tp_rank");
  check(g->ranks_per_node == rpn && g->n_nodes == n_nodes && g->node == w / rpn &&
            g->local_rank == w % rpn,
        "%d node(s) of %d ranks, node = world rank / %d", n_nodes, rpn, rpn);
  check(g->shard_size == S && g->replicate_size == R && g->shard_size * g->replicate_size == dp,
        "shard_scope '%s': dp %d = dp_shard %d x dp_replicate %d", scope, dp, S, R);
  check(S > 0 && g->shard_rank == d % S && g->replicate_rank == d / S,
        "dp_rank = replicate_rank * shard_size + shard_rank");

  int *want = malloc(sizeof(int) * (size_t)ws);
  for (int j = 0; j < ws; j++) want[j] = j;
  check(group_is(g->world, want, ws, w), "world group = all %d ranks", ws);
  for (int j = 0; j < tp; j++) want[j] = w - t + j;
  check(group_is(g->tp_comm, want, tp, w), "tp group = %d consecutive ranks", tp);
  for (int j = 0; j < pp; j++) want[j] = j * dp * tp + d * tp + t;
  check(group_is(g->pp_comm, want, pp, w), "pp group = ranks at stride dp*tp = %d", dp * tp);
  for (int j = 0; j < dp; j++) want[j] = p * dp * tp + j * tp + t;
  check(group_is(g->dp_comm, want, dp, w), "dp group = ranks at stride tp = %d in a stage", tp);
  int ok_shard = S > 0, ok_shard_node = 1;
  if (S > 0) {
    for (int j = 0; j < S; j++) {
      want[j] = p * dp * tp + (d / S * S + j) * tp + t;
      ok_shard_node &= want[j] / rpn == w / rpn;
    }
    ok_shard = group_is(g->dp_shard, want, S, w);
  }
  check(ok_shard, "dp_shard = dp ranks [%d k, %d k + %d) of this dp group", S, S, S);
  int ok_rep = R > 0, ok_rep_nodes = 1;
  if (R > 0) {
    for (int j = 0; j < R; j++) {
      want[j] = p * dp * tp + (d % S + j * S) * tp + t;
      for (int i = 0; i < j; i++) ok_rep_nodes &= want[i] / rpn != want[j] / rpn;
    }
    ok_rep = group_is(g->dp_replicate, want, R, w);
  }
  check(ok_rep, "dp_replicate = dp ranks at stride shard_size %d", S);
  if (!strcmp(scope, "node")) {
    check(ok_shard_node, "shard_scope 'node': each dp_shard group lies on one node");
    check(ok_rep_nodes, "shard_scope 'node': each dp_replicate member is on its own node");
  }
  for (int j = 0; j < rpn; j++) want[j] = w / rpn * rpn + j;
  check(group_is(g->node_comm, want, rpn, w), "node group = world ranks [%d n, %d n + %d)", rpn,
        rpn, rpn);

  /* The tp group never crosses a node: asked through the group itself. */
  int lo = -g->node, hi = g->node;
  int ok = tsr_comm_all_reduce_int(g->tp_comm, &lo, 1, TSR_COMM_MAX) == 0 &&
           tsr_comm_all_reduce_int(g->tp_comm, &hi, 1, TSR_COMM_MAX) == 0 && -lo == hi;
  check(ok, "every tp group lies inside one node");
  check(!strcmp(tsr_comm_name(g->tp_comm), "tp") && !strcmp(tsr_comm_name(g->dp_shard), "dp_shard") &&
            !strcmp(tsr_comm_name(g->dp_replicate), "dp_replicate"),
        "groups carry their names");
  free(want);

  tsr_grid_destroy(&g);
  check(g == NULL, "tsr_grid_destroy NULLs the handle");
  tsr_comm_destroy(&world);
  if (g_rank == 0) printf("test_grid: %d checks passed, %d failed\n", n_pass, n_fail);
  MPI_Finalize();
  return n_fail ? 1 : 0;
}
