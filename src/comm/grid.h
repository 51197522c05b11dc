/* grid.h — the process grid (tp x cp x dp x pp) and its communicators.
 *
 * Rank order is tp fastest, then cp (context parallelism), then dp, then pp:
 *     world rank = pp_rank * (dp * cp * tp) + dp_rank * (cp * tp) + cp_rank * tp + tp_rank
 * so the tp ranks of a group are consecutive and, with tp dividing the ranks per node,
 * live inside one node; the cp ranks of a sequence come next, on the same node while
 * tp * cp fits one (docs/context_parallel.md says why).  dp = world size / (tp * cp * pp).
 *
 * Parameters are replicated over dp and cp alike: the cp ranks of a sequence hold the same
 * weights and sum their gradients, so dp_comm and ZeRO's groups below span the dp x cp =
 * dpcp ranks of a (pp, tp) position, numbered dpcp_rank = dp_rank * cp + cp_rank.  With
 * cp = 1 they are the data-parallel groups.  Samples are dealt by dp_rank only: the cp
 * ranks of one dp rank read the same sequences and keep their chunks of them.
 *
 * Nodes are consecutive blocks of ranks_per_node world ranks (node = world_rank /
 * ranks_per_node), detected with MPI_COMM_TYPE_SHARED or set by &parallel
 * ranks_per_node to lay out several "nodes" on one machine.
 *
 * The dp (x cp) group is split for hybrid sharding (HSDP) by &parallel shard_scope:
 *   'global'  dp_shard = the whole dp x cp group, dp_replicate = this rank alone
 *   'node'    dp_shard = the ranks of this dp x cp group on this node
 *   'N'       dp_shard = N consecutive ranks of it (N divides dp x cp)
 * dp_replicate = the ranks that hold the same position in their dp_shard group, so
 *   dpcp_rank = replicate_rank * shard_size + shard_rank,  dpcp = shard_size * replicate_size.
 *
 * This header does not include mpi.h: model code may read the grid.  The driver makes
 * the world group with tsr_comm_create (comm_mpi.h) and passes it in. */
#ifndef TSR_GRID_H
#define TSR_GRID_H

#include <stddef.h>

#include "comm.h"
#include "core/config.h"

typedef struct tsr_grid {
  int world_rank, world_size;
  int tp, pp, dp, cp, dpcp; /* dpcp = dp * cp */
  int tp_rank, pp_rank, dp_rank, cp_rank, dpcp_rank;
  int node, n_nodes, ranks_per_node, local_rank;
  int ranks_per_node_from_deck; /* 1: &parallel ranks_per_node, 0: detected */
  int shard_size, shard_rank, replicate_size, replicate_rank;
  int64_t shard_scope; /* as given: TSR_SHARD_GLOBAL, TSR_SHARD_NODE or a number of ranks */
  /* dp_comm: the dp x cp ranks holding the same parameters ("dp" when cp = 1, else
   * "dp_cp"); cp_comm: the cp ranks of one sequence (a group of one when cp = 1) */
  tsr_comm *world, *tp_comm, *pp_comm, *dp_comm, *cp_comm, *dp_shard, *dp_replicate, *node_comm;
  /* tied embeddings across a pipeline (model.tie_embeddings, pp > 1): the first and the
   * last stage of this rank's (dp, tp) column; NULL on the other stages and otherwise */
  tsr_comm *embed_tied;
  int nccl_used, staged_used; /* device transports attached (tsr_grid_attach_device) */
} tsr_grid;

/* What the grid is built from: the parallel group, whether the embedding is tied (a pair of
 * stages then shares it), and the check of the whole layout once the world size and the
 * ranks per node are known: 0, or nonzero with the problem written to msg.  A run's
 * configuration gives all three (tsr_grid_spec_of, grid_spec.c: the check is the deck's
 * layout rules, tsr_layout_check, on that configuration, which must outlive the spec). */
typedef int (*tsr_grid_check_fn)(const void *ctx, int world, int ranks_per_node, char *msg,
                                 size_t len);
typedef struct {
  tsr_parallel_config parallel;
  int tie_embeddings;
  tsr_grid_check_fn check; /* NULL: none */
  const void *check_ctx;
} tsr_grid_spec;
void tsr_grid_spec_of(tsr_grid_spec *spec, const tsr_config *cfg);

/* Collective over `world`.  Checks the layout (every rank reaches the same verdict from
 * the same inputs, so a bad layout never hangs) with spec->check: for a run's
 * configuration, world size divisible by tp * pp, train.global_batch divisible by
 * train.micro_batch * dp, ranks_per_node dividing the world size, tp dividing
 * ranks_per_node, shard_scope dividing dp, and the model's rules.  On a bad layout rank 0
 * prints one message, and every rank returns TSR_ERR_INPUT with *out = NULL. */
int tsr_grid_create(tsr_grid **out, const tsr_grid_spec *spec, const tsr_comm *world);

/* Rank 0 logs the layout: a summary line and, per kind of group, which world ranks form
 * each group and which node they are on (the first 16 groups and 16 members, then "…").
 * Reads only the integer fields, so it needs no communication. */
void tsr_grid_log(const tsr_grid *g);

/* collective; NULLs *g; after its groups, closes the device transports they used */
void tsr_grid_destroy(tsr_grid **g);

/* On a GPU, the groups that move device memory get a device transport (comm_dev.h): the
 * tp group, `n_zero` groups ZeRO names (tsr_zero_device_groups), the tied-embedding pair,
 * and the pipeline's and the cp group's send/recv (the ring, and the all-to-alls, which
 * run as send/recv pairs on a device).  NCCL for those inside a node always, for those
 * across nodes only under parallel.inter_node = 'nccl' (never the pipeline's or cp's:
 * NCCL has no send/recv here).  What stays on MPI goes through pinned host buffers when MPI cannot
 * take GPU memory itself (parallel.mpi_gpu: 'auto' asks MPIX_Query_cuda_support), else
 * straight to MPI.  Collective over the world; rank 0 logs what each group uses. */
int tsr_grid_attach_device(tsr_grid *g, const tsr_parallel_config *par,
                           tsr_comm *const *zero_groups, int n_zero);

/* Traffic counters of the logged groups (dp, dp_shard, dp_replicate, tp, pp, world):
 * reset them, or describe what they moved as "dp_shard 1.23 MB (reduce_scatter 0.61,
 * all_gather 0.61); ..." ("none" when nothing moved). */
void tsr_grid_reset_traffic(tsr_grid *g);
void tsr_grid_describe_traffic(const tsr_grid *g, char *buf, size_t len);

/* *spans = 1 when the ranks of c (one of the grid's groups, or another group of its
 * ranks) are on more than one node.  Collective over c; 0 for a group of one rank. */
int tsr_grid_spans_nodes(const tsr_grid *g, tsr_comm *c, int *spans);

#endif
