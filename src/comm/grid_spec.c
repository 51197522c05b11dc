/* grid_spec.c — the grid's view of a run's configuration, taken in one place: the parallel
 * group, the tied embedding, and the deck's layout rules (layout_check.c) as the check
 * tsr_grid_create applies once it knows the world size and the ranks per node. */
#include "grid.h"

#include <string.h>

#include "deck/layout_check.h"

static int check_config(const void *ctx, int world, int ranks_per_node, char *msg, size_t len) {
  const tsr_config *cfg = ctx;
  tsr_layout_issue is;
  if (!tsr_layout_check(cfg, world, ranks_per_node, &is, 1)) return 0;
  tsr_layout_issue_text(&is, cfg, NULL, NULL, msg, len);
  return 1;
}

void tsr_grid_spec_of(tsr_grid_spec *spec, const tsr_config *cfg) {
  memset(spec, 0, sizeof *spec);
  spec->parallel = cfg->parallel;
  spec->tie_embeddings = cfg->model.tie_embeddings;
  spec->check = check_config;
  spec->check_ctx = cfg;
}
