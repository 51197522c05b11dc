/* test_deck.c — the namelist deck: bad decks give the right message at the right line:col,
 * every syntax feature parses, overrides work, write -> parse is exact, every shipped deck
 * in input/ is valid for its intended world size, and every config.h field is in the schema.
 * Exit 0 pass, 1 fail; one line per case. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "sched/registry.h"
#include "deck/deck.h"
#include "core/util.h"

static int n_pass = 0, n_fail = 0;
static char errbuf[1 << 16];

static void result(int ok, const char *what, const char *detail) {
  if (ok) n_pass++;
  else n_fail++;
  printf("%s: %s\n", ok ? "PASS" : "FAIL", what);
  if (!ok && detail && detail[0]) printf("    got:\n%s\n", detail);
}

/* Is there an error line that starts with `where: ` and contains `msg`? */
static int has_error(const char *errs, const char *where, const char *msg) {
  char prefix[256];
  snprintf(prefix, sizeof prefix, "%s: ", where);
  for (const char *line = errs; *line;) {
    const char *end = strchr(line, '\n');
    size_t n = end ? (size_t)(end - line) : strlen(line);
    char buf[2048];
    snprintf(buf, sizeof buf, "%.*s", (int)n, line);
    if (!strncmp(buf, prefix, strlen(prefix)) && strstr(buf, msg)) return 1;
    line += n + (end != NULL);
  }
  return 0;
}

static int parse(tsr_config *c, const char *deck, int nov, char **ov, int ws) {
  memset(c, 0, sizeof *c);
  return tsr_deck_parse(c, deck, strlen(deck), "t.nml", nov, ov, ws, errbuf, sizeof errbuf);
}

/* ---------------------------------------------------------------- bad decks */

typedef struct {
  const char *deck;
  int world_size;
  const char *where; /* "line:col" in t.nml, or a full location such as "<defaults>" */
  const char *msg;
} bad_case;

static const bad_case bad[] = {
    {"&modle n_layer = 2 /", 1, "1:1", "unknown group '&modle'; did you mean '&model'?"},
    {"&run\n  out_dir = ''\n/", 1, "2:3", "run.out_dir is empty: name the directory"},
    {"&gpu gpus_per_node = 4 /", 1, "1:1",
     "unknown group '&gpu'; the groups are &run &model &parallel &train &optim &data "
     "&checkpoint &hardware"},
    {"&checkpoint\n  mpiio_hints = 'romio_cb_write=enable,striping'\n/", 1, "2:3",
     "checkpoint.mpiio_hints: item 2 ('striping') is not key=value"},
    {"&checkpoint mpiio_hints = 'a=b,,c' /", 1, "1:13",
     "checkpoint.mpiio_hints: item 2 is empty (two ',' in a row)"},
    {"&model\n  n_layr = 2\n/", 1, "2:3", "unknown key 'n_layr' in &model; did you mean 'n_layer'?"},
    {"&train lr = 1e-3 /", 1, "1:8", "key 'lr' is in group &optim, not &train"},
    {"&train warmup_step = 3 /", 1, "1:8", "did you mean 'warmup_steps' in &optim?"},
    {"&model zzzzzzzz = 1 /", 1, "1:8", "unknown key 'zzzzzzzz' in &model (tessera --help-deck"},
    {"&train micro_batch = abc /", 1, "1:22", "&train micro_batch expects an integer, got 'abc'"},
    {"&train\n  micro_batch = 0\n/", 1, "2:17", "&train micro_batch = 0 is out of range: must be >= 1"},
    {"&model n_layer = 0 /", 1, "1:18", "&model n_layer = 0 is out of range: must be in [1, 1024]"},
    {"&model n_layer = 1.5 /", 1, "1:18", "&model n_layer expects an integer, got '1.5'"},
    {"&model n_layer = 1e3 /", 1, "1:18", "expects an integer, got '1e3'"},
    {"&model n_layer = 1_000 /", 1, "1:18", "expects an integer, got '1_000'"},
    {"&run seed = 99999999999999999999 /", 1, "1:13", "is too large for an integer"},
    {"&optim lr = 1.0q-4 /", 1, "1:13", "&optim lr expects a real number, got '1.0q-4'"},
    {"&optim lr = 1d999 /", 1, "1:13", "&optim lr = 1d999 overflows a double"},
    {"&optim beta1 = 1.0 /", 1, "1:16", "&optim beta1 = 1.0 is out of range: must be in [0, 1)"},
    {"&optim eps = 0 /", 1, "1:14", "&optim eps = 0 is out of range: must be in (0, 1]"},
    {"&parallel zero_stage = 4 /", 1, "1:24", "must be in [0, 3]"},
    {"&model tie_embeddings = yes /", 1, "1:25", "expects a logical (.true. or .false., T or F), got 'yes'"},
    {"&model tie_embeddings = 'T' /", 1, "1:25", "expects a logical, got the string 'T'"},
    {"&model arch = 'lama' /", 1, "1:15",
     "&model arch = 'lama' is not allowed: choose one of 'llama', 'gpt2'; did you mean 'llama'?"},
    {"&model arch = llama /", 1, "1:15", "&model arch expects a quoted string, got llama; write 'llama'"},
    {"&train precision = 'fp8' /", 1, "1:20", "choose one of 'fp32', 'bf16', 'fp16'"},
    {"&parallel shard_scope = 'nodes' /", 1, "1:25", "use 'global', 'node' or a positive number"},
    {"&parallel shard_scope = '0' /", 1, "1:25", "&parallel shard_scope = '0' is not allowed"},
    {"&checkpoint every_steps = 'auto' /", 1, "1:13",
     "checkpoint.every_steps = 'auto' needs checkpoint.mtbf_hours > 0"},
    {"&checkpoint\n  every_steps = 'auto'\n  mtbf_hours = 0\n/", 1, "3:3",
     "needs checkpoint.mtbf_hours > 0, the job's mean time between failures in hours"},
    {"&checkpoint every_steps = auto /", 1, "1:27",
     "&checkpoint every_steps expects an integer or the string 'auto', got auto; write 'auto'"},
    {"&checkpoint every_steps = 'often' /", 1, "1:27",
     "&checkpoint every_steps expects an integer or 'auto', got 'often'"},
    {"&checkpoint every_steps = '5' /", 1, "1:27", "expects an integer or 'auto', got '5'"},
    {"&checkpoint every_steps = -1 /", 1, "1:27",
     "&checkpoint every_steps = -1 is out of range: must be >= 0 or 'auto'"},
    {"&checkpoint mtbf_hours = -1 /", 1, "1:26", "mtbf_hours = -1 is out of range: must be >= 0"},
    {"&model n_layer = 2, 3 /", 1, "1:21", "&model n_layer expects one value, got 2"},
    {"&model n_layer = 3*2 /", 1, "1:18", "&model n_layer expects one value, got 3"},
    {"&run name = 2*'a' /", 1, "1:13", "&run name expects one value, got 2"},
    {"&model n_layer = /", 1, "1:8", "&model n_layer has no value after '='"},
    {"&model\n n_layer = 2\n n_layer = 3\n/", 1, "3:2",
     "duplicate key 'n_layer' in &model (first set at t.nml:2:2)"},
    {"&model /\n&MODEL /", 1, "2:1", "duplicate group &model (first opened at t.nml:1:1)"},
    {"\n  &model\n n_layer = 2\n", 1, "2:3", "group &model is not closed: missing '/' at its end"},
    {"&model n_layer = 2\n&train micro_batch = 8 /", 1, "1:1",
     "group &model is not closed: missing '/' before &train on line 2"},
    {"&run name = 'abc\n/", 1, "1:13", "unterminated string: missing closing '"},
    {"&run\n  out_dir = \"abc /\n/", 1, "2:13", "unterminated string: missing closing \""},
    {"&model n_layer 2 /", 1, "1:8", "missing '=' after 'n_layer' in &model"},
    {"&model\n  d_ff 12\n  n_layer = 2\n/", 1, "2:3", "missing '=' after 'd_ff' in &model"},
    {"&model n_layer = 2 @ /", 1, "1:20", "unexpected character '@'"},
    {"&model # a comment\n/", 1, "1:8", "unexpected character '#': comments start with '!'"},
    {"&model n_layer = 2 /\n\x01", 1, "2:1", "unexpected character '\\x01'"},
    {"n_layer = 2\n", 1, "1:1", "unexpected 'n_layer' outside a group"},
    {"&end", 1, "1:1", "'&end' without an open group"},
    {"& model /", 1, "1:1", "expected a group name after '&'"},
    {"&model = 2 /", 1, "1:8", "unexpected '=' without a key name in &model"},
    {"&model 'x' /", 1, "1:8", "expected 'key = value' in &model, got 'x'"},
    {"&run name = '0123456789012345678901234567890123456789012345678901234567890123456789' /", 1,
     "1:13", "&run name is too long: 70 characters, at most 63"},
    {"&run name = 'a\tb' /", 1, "1:13", "&run name contains a control character"},
    /* cross-field checks: reported where the later of the two was set, naming both */
    {"&model\n  d_model = 128\n  n_head = 6\n/", 1, "3:3",
     "model.n_head = 6 does not divide model.d_model = 128 (set at t.nml:2:3)"},
    {"&model\n  n_head = 6\n  d_model = 130\n/", 1, "3:3",
     "model.n_head = 6 (set at t.nml:2:3) does not divide model.d_model = 130"},
    {"&model d_model = 132, n_head = 4, n_kv_head = 4 /", 1, "1:23",
     "head dimension model.d_model = 132 (set at t.nml:1:8) / model.n_head = 4 = 33 is odd"},
    {"&model n_kv_head = 3 /", 1, "1:8", "model.n_kv_head = 3 does not divide model.n_head = 4"},
    {"&parallel tp = 3 /", 3, "1:11", "parallel.tp = 3 does not divide model.n_head = 4"},
    {"&model d_model = 192, n_head = 12, n_kv_head = 3 /\n&parallel tp = 2 /", 2, "2:11",
     "parallel.tp = 2 and model.n_kv_head = 3 (set at t.nml:1:36): one must divide the other"},
    {"&parallel pp = 3 /", 3, "1:11", "parallel.pp = 3 does not divide model.n_layer = 4"},
    {"&model vocab_size = 1001 /\n&parallel tp = 2 /", 2, "2:11",
     "parallel.tp = 2 does not divide model.vocab_size = 1001 (set at t.nml:1:8)"},
    {"&parallel tp = 2 /", 3, "1:11",
     "world size 3 is not a multiple of parallel.tp = 2 * parallel.pp = 1 = 2"},
    {"&train micro_batch = 4, global_batch = 12 /", 2, "1:25",
     "train.global_batch = 12 is not a multiple of train.micro_batch = 4 (set at t.nml:1:8) * dp 2 "
     "= 8 (dp = world size 2 / (tp 1 * pp 1))"},
    {"", 3, "<defaults>",
     "train.global_batch = 8 is not a multiple of train.micro_batch = 8 * dp 3 = 24"},
    /* the values that would work: the nearest multiples, the largest micro-batch below */
    {"&train micro_batch = 4, global_batch = 12 /", 2, "1:25",
     "(dp = world size 2 / (tp 1 * pp 1)): train.global_batch = 8 or 16 would do, or "
     "train.micro_batch = 3"},
    {"&train micro_batch = 16, global_batch = 16 /", 4, "1:26",
     "* dp 4 = 64 (dp = world size 4 / (tp 1 * pp 1)): train.global_batch = 64 would do, or "
     "train.micro_batch = 4"},
    {"&optim lr = 1e-4, min_lr = 1e-3 /", 1, "1:19",
     "optim.min_lr = 0.001 is larger than optim.lr = 0.0001 (set at t.nml:1:8)"},
    {"&optim warmup_steps = 100, decay_steps = 50 /", 1, "1:28",
     "optim.warmup_steps = 100 (set at t.nml:1:8) is larger than optim.decay_steps = 50"},
    /* the model's context, RoPE scaling, init_from */
    {"&model seq_len = 256, max_positions = 128 /", 1, "1:23",
     "model.seq_len = 256 (set at t.nml:1:8) is larger than model.max_positions = 128, the "
     "model's context"},
    {"&model rope_scaling = 'llama3', rope_low_freq_factor = 4, rope_high_freq_factor = 2 /", 1,
     "1:59", "model.rope_low_freq_factor = 4.0 (set at t.nml:1:33) must be smaller than "
     "model.rope_high_freq_factor = 2.0"},
    {"&model arch = 'gpt2', rope_scaling = 'llama3' /", 1, "1:23",
     "model.rope_scaling = 'llama3' needs RoPE, which model.arch = 'gpt2' (set at t.nml:1:8) "
     "has not"},
    {"&model rope_factor = 0 /", 1, "1:22", "rope_factor = 0 is out of range: must be > 0"},
    {"&checkpoint init_from = 'a.h5', resume = 'b.h5' /", 1, "1:33",
     "checkpoint.init_from = 'a.h5' (set at t.nml:1:13) and checkpoint.resume = 'b.h5' both "
     "name weights"},
    {"&parallel virtual_stages = 2 /", 1, "1:11",
     "parallel.virtual_stages = 2 needs parallel.schedule = 'interleaved' or 'zb_v', not parallel.schedule = '1f1b'"},
    {"&parallel pp = 2, schedule = 'zb_v' /\n&model n_layer = 8 /", 2, "1:19",
     "parallel.schedule = 'zb_v' places two chunks on every stage (a V): "
     "parallel.virtual_stages = 1 must be 2"},
    {"&parallel virtual_stages = 2, schedule = 'interleaved' /", 1, "1:11",
     "parallel.virtual_stages = 2 needs a pipeline: parallel.pp = 1 must be at least 2"},
    /* interleaving needs the micro-batches by pp: the global batches that would do */
    {"&train micro_batch = 8, global_batch = 24 /\n&parallel pp = 2, virtual_stages = 2, "
     "schedule = 'interleaved' /", 2, "2:19",
     "train.global_batch = 24 (set at t.nml:1:25) / (train.micro_batch = 8 (set at t.nml:1:8) "
     "* dp 1) = 3, divisible by parallel.pp = 2 (set at t.nml:2:11): train.global_batch = 16 "
     "or 32 would do"},
    {"&parallel micro_batches = 3 /", 1, "1:11", "parallel.micro_batches = 3 does not match"},
    {"&parallel shard_scope = '3' /", 2, "1:11", "parallel.shard_scope = '3' does not divide dp = 2"},
    /* uneven pipeline splits: the list is checked against pp x virtual_stages and n_layer */
    {"&model n_layer = 7 /\n&parallel pp = 2, stage_layers = '3,2,2' /", 2, "2:19",
     "parallel.stage_layers = '3,2,2': 3 layer counts for 2 chunks (parallel.pp 2 * "
     "parallel.virtual_stages 1)"},
    {"&model n_layer = 7 /\n&parallel pp = 2, stage_layers = '4,4' /", 2, "2:19",
     "parallel.stage_layers = '4,4': the counts sum to 8 layers, not model.n_layer = 7"},
    {"&model n_layer = 7 /\n&parallel pp = 3, stage_layers = '4,3,0' /", 3, "2:19",
     "parallel.stage_layers = '4,3,0': item 3 is 0: every chunk needs at least one layer"},
    {"&parallel pp = 2, stage_layers = '4;3' /", 2, "1:19",
     "parallel.stage_layers = '4;3': item 1 is not followed by ',' and a count"},
    {"&model n_layer = 7 /\n&parallel pp = 2 /", 2, "2:11",
     "parallel.pp = 2 does not divide model.n_layer = 7 (set at t.nml:1:8) (every pipeline "
     "stage holds the same number of layers; parallel.stage_layers splits unevenly)"},
};

/* Good splits: a list and 'auto' make n_layer = 7 legal on pp 2 and 3 (interleaved too). */
static void test_stage_layers(void) {
  static const struct {
    const char *deck;
    int world;
  } good[] = {
      {"&model n_layer = 7 /\n&parallel pp = 2, stage_layers = ' 4, 3' /", 2},
      {"&model n_layer = 7 /\n&parallel pp = 3, stage_layers = 'auto' /", 3},
      {"&model n_layer = 7 /\n&train micro_batch = 1 /\n&parallel pp = 2, virtual_stages = 2, "
       "schedule = 'interleaved', stage_layers = '2,2,2,1' /", 2},
      {"&parallel pp = 2, stage_layers = '' /", 2},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    tsr_config c;
    char what[160];
    const int rc = parse(&c, good[i].deck, 0, NULL, good[i].world);
    snprintf(what, sizeof what, "good split %zu accepted", i + 1);
    result(rc == 0, what, errbuf);
  }
}

static void test_bad_decks(void) {
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tsr_config c;
    char where[64], what[256];
    int rc = parse(&c, bad[i].deck, 0, NULL, bad[i].world_size);
    if (bad[i].where[0] == '<') snprintf(where, sizeof where, "%s", bad[i].where);
    else snprintf(where, sizeof where, "t.nml:%s", bad[i].where);
    snprintf(what, sizeof what, "bad deck %2zu -> %s: %.80s", i + 1, where, bad[i].msg);
    result(rc == TSR_ERR_INPUT && has_error(errbuf, where, bad[i].msg), what, errbuf);
  }
}

/* ---------------------------------------------------------------- overrides */

typedef struct {
  const char *deck;
  const char *ov[3];
  const char *where, *msg;
} bad_override;

static const bad_override bad_ov[] = {
    {"", {"model.n_layre=3"}, "<command line>:arg1:7",
     "unknown key 'n_layre' in &model; did you mean 'n_layer'?"},
    {"", {"optim.lr=abc"}, "<command line>:arg1:10", "&optim lr expects a real number, got 'abc'"},
    {"", {"run.seed=5", "train.micro_batch=0"}, "<command line>:arg2:19",
     "&train micro_batch = 0 is out of range: must be >= 1"},
    {"", {"n_layer=3"}, "<command line>:arg1:1", "'n_layer' needs its group: write model.n_layer=..."},
    {"", {"model.n_layer"}, "<command line>:arg1:1", "expected group.key=value, got 'model.n_layer'"},
    {"", {"modle.n_layer=3"}, "<command line>:arg1:1", "unknown group '&modle'; did you mean '&model'?"},
    {"", {"train.lr=1"}, "<command line>:arg1:7", "key 'lr' is in group &optim, not &train"},
    {"", {"model.arch=lama"}, "<command line>:arg1:12", "did you mean 'llama'?"},
    {"", {"checkpoint.every_steps=auto"}, "<command line>:arg1:1",
     "checkpoint.every_steps = 'auto' needs checkpoint.mtbf_hours > 0"},
    {"", {"checkpoint.every_steps=sometimes"}, "<command line>:arg1:24",
     "expects an integer or 'auto', got 'sometimes'"},
    {"", {"run.seed=1,2"}, "<command line>:arg1:12", "&run seed expects one value, got 2"},
    {"", {"model.n_layer="}, "<command line>:arg1:1", "&model n_layer has no value after '='"},
    {"", {"run.out_dir=''"}, "<command line>:arg1:1", "run.out_dir is empty"},
    {"", {"model.n_layer=3 /"}, "<command line>:arg1:17", "unexpected '/' in the value of model.n_layer"},
    {"", {"data.train='abc"}, "<command line>:arg1:12", "unterminated string: missing closing '"},
    {"", {"data.shuffle=maybe"}, "<command line>:arg1:14", "&data shuffle expects a logical"},
    {"&model\n  d_model = 128\n/", {"model.n_head=6"}, "<command line>:arg1:1",
     "model.n_head = 6 does not divide model.d_model = 128 (set at t.nml:2:3)"},
};

static void test_overrides(void) {
  tsr_config c;
  char what[256];
  for (size_t i = 0; i < sizeof bad_ov / sizeof bad_ov[0]; i++) {
    int n = 0;
    while (n < 3 && bad_ov[i].ov[n]) n++;
    int rc = parse(&c, bad_ov[i].deck, n, (char **)bad_ov[i].ov, 1);
    snprintf(what, sizeof what, "bad override %2zu -> %s: %.70s", i + 1, bad_ov[i].where, bad_ov[i].msg);
    result(rc == TSR_ERR_INPUT && has_error(errbuf, bad_ov[i].where, bad_ov[i].msg), what, errbuf);
  }

  const char *good[] = {"parallel.schedule=gpipe", "data.train=data/x_*.bin", "run.name='it''s'",
                        "  model.n_layer = 6 ", "optim.lr=1.0d-3", "data.shuffle=T",
                        "model.arch=GPT2", "checkpoint.resume=none", "parallel.shard_scope=4",
                        "checkpoint.dir=", "run.out_dir=\"a \"\"b\"\"\"", "train.micro_batch=2"};
  int rc = parse(&c, "&model\n  n_layer = 2\n/\n&data shuffle = F /", 12, (char **)good, 4);
  int ok = rc == 0 && c.parallel.schedule == TSR_SCHEDULE_GPIPE &&
           !strcmp(c.data.train_glob[0], "data/x_*.bin") && !strcmp(c.run.name, "it's") &&
           c.model.n_layer == 6 && c.optim.lr == 1.0e-3 && c.data.shuffle == 1 &&
           c.model.arch == TSR_ARCH_GPT2 && !strcmp(c.checkpoint.resume, "none") &&
           c.parallel.shard_scope == 4 && c.checkpoint.dir[0] == 0 &&
           !strcmp(c.run.out_dir, "a \"b\"");
  result(ok, "good overrides: bare words, quotes, spaces, d exponent, later wins over the deck", errbuf);
  /* bare words as a shell user types them, one that starts with a digit included, each
   * over the deck's value */
  const char *words[] = {"parallel.schedule=1f1b", "parallel.shard_scope=node",
                         "train.recompute=selective", "optim.decay=wsd", "checkpoint.resume=auto"};
  rc = parse(&c,
             "&parallel schedule = 'gpipe', shard_scope = 'global' /\n&train recompute = 'full' /\n"
             "&optim decay = 'linear' /\n&checkpoint resume = 'none' /",
             5, (char **)words, 1);
  result(rc == 0 && c.parallel.schedule == TSR_SCHEDULE_1F1B &&
             c.parallel.shard_scope == TSR_SHARD_NODE &&
             c.train.recompute == TSR_RECOMPUTE_SELECTIVE && c.optim.decay == TSR_DECAY_WSD &&
             !strcmp(c.checkpoint.resume, "auto"),
         "bare-word overrides: schedule=1f1b, shard_scope=node, recompute, decay, resume", errbuf);
  /* the head: gpt2's is the embedding and llama's its own, unless the deck says */
  int tie[4];
  char *untie[] = {"model.tie_embeddings=F"};
  tie[0] = parse(&c, "&model arch = 'gpt2' /", 0, NULL, 1) ? -9 : c.model.tie_embeddings;
  tie[1] = parse(&c, "&model arch = 'gpt2', tie_embeddings = .false. /", 0, NULL, 1)
               ? -9 : c.model.tie_embeddings;
  tie[2] = parse(&c, "&model arch = 'gpt2' /", 1, untie, 1) ? -9 : c.model.tie_embeddings;
  tie[3] = parse(&c, "&model arch = 'llama' /", 0, NULL, 1) ? -9 : c.model.tie_embeddings;
  result(tie[0] == 1 && tie[1] == 0 && tie[2] == 0 && tie[3] == 0,
         "tie_embeddings not given: gpt2 tied, llama untied; .false. unties gpt2", errbuf);
  /* a repeat count, in the deck and in an override's value (deck syntax) */
  char *rep[] = {"data.valid_weights=2*0.25"};
  rc = parse(&c,
             "&data train = 'a/x_*.bin', 'b/x_*.bin', 'c/x_*.bin', weights = 3*0.5,\n"
             "  valid = 'a/v_*.bin', 'b/v_*.bin' /",
             1, rep, 1);
  result(rc == 0 && c.data.n_weights == 3 && c.data.weights[0] == 0.5 &&
             c.data.weights[2] == 0.5 && c.data.n_valid_weights == 2 &&
             c.data.valid_weights[0] == 0.25 && c.data.valid_weights[1] == 0.25,
         "repeat counts: weights = 3*0.5 in the deck, valid_weights=2*0.25 on the command line",
         errbuf);
  rc = parse(&c, "&model n_layer = 2 /", 0, NULL, 1);
  result(rc == 0 && c.data.shuffle == 1, "data.shuffle defaults to .true.", errbuf);
  rc = parse(&c, "&data shuffle = .false. /", 0, NULL, 1);
  result(rc == 0 && c.data.shuffle == 0, "data.shuffle = .false. reads in file order", errbuf);
}

/* ---------------------------------------------------------------- good syntax */

static void test_good_syntax(void) {
  const char *deck =
      "! a deck that uses every piece of the syntax\n"
      "&RUN name = 'it''s a \"test\"', seed = 42 ! trailing comment\n"
      "     max_steps =\n"
      "       7,\n"
      "/\n"
      "\n"
      "&Model N_LAYER=2, d_model=64 n_head = 2\n"
      "  n_kv_head = 1, tie_embeddings = T rope_theta = 1.0D4 norm_eps=1d-6\n"
      "  init_std = .05, arch = 'Llama'\n"
      "/\n"
      "&optim lr = 1.5E-3 min_lr = 0 beta1 = +.9, eps = 1e-08 weight_decay = 1 /\n"
      "&data shuffle = .TRUE. train = \"a/b\"\"c!d\" valid = '' /\n"
      "&checkpoint save_initial = .t. resume = 'none' every_minutes = 2.5\n"
      "&end\n"
      "&train precision='bf16' recompute=\"full\", grad_clip = 0.0 /\n"
      "&parallel sequence_parallel = .false., schedule = 'gpipe' /\n";
  tsr_config c;
  int rc = parse(&c, deck, 0, NULL, 1);
  int ok = rc == 0 && !strcmp(c.run.name, "it's a \"test\"") && c.run.seed == 42 &&
           c.run.max_steps == 7 && c.model.n_layer == 2 && c.model.d_model == 64 &&
           c.model.n_head == 2 && c.model.n_kv_head == 1 && c.model.tie_embeddings == 1 &&
           c.model.rope_theta == 1.0e4 && c.model.norm_eps == 1e-6 && c.model.init_std == 0.05 &&
           c.model.arch == TSR_ARCH_LLAMA && c.optim.lr == 1.5e-3 && c.optim.min_lr == 0 &&
           c.optim.beta1 == 0.9 && c.optim.eps == 1e-8 && c.optim.weight_decay == 1.0 &&
           c.data.shuffle == 1 && !strcmp(c.data.train_glob[0], "a/b\"c!d") && c.data.valid_glob[0][0] == 0 &&
           c.checkpoint.save_initial == 1 && !strcmp(c.checkpoint.resume, "none") &&
           c.checkpoint.every_minutes == 2.5 && c.train.precision == TSR_BF16 &&
           c.train.recompute == TSR_RECOMPUTE_FULL && c.train.grad_clip == 0.0 &&
           c.parallel.schedule == TSR_SCHEDULE_GPIPE && c.model.vocab_size == 2048 /* default */;
  result(ok, "good deck: comments, case, d exponents, T/.t., quotes, commas, spanning lines, &end",
         errbuf);

  rc = parse(&c, "", 0, NULL, 1);
  tsr_config d;
  memset(&d, 0, sizeof d);
  tsr_deck_defaults(&d);
  ok = rc == 0 && !memcmp(&c, &d, sizeof c) && c.run.seed == 1234 && c.model.n_kv_head == 4 &&
       c.optim.lr == 3e-4 && c.parallel.shard_scope == TSR_SHARD_GLOBAL &&
       !strcmp(c.checkpoint.resume, "auto") && c.optim.wsd_decay_frac == 0.2;
  result(ok, "empty deck gives the documented defaults, and they pass every check", errbuf);

  rc = parse(&c, "&model arch = 'gpt2', d_model = 132, n_head = 4 /", 0, NULL, 1);
  result(rc == 0, "odd head dimension is fine for gpt2 (no RoPE)", errbuf);
  rc = parse(&c, "&train precision = 'fp16' / &parallel shard_scope = 'node' /", 0, NULL, 1);
  result(rc == 0 && c.train.precision == TSR_F16 && c.parallel.shard_scope == TSR_SHARD_NODE,
         "fp16 and shard_scope 'node' accepted", errbuf);
  rc = parse(&c, "&checkpoint every_steps = 'Auto', mtbf_hours = 12 /", 0, NULL, 1);
  result(rc == 0 && c.checkpoint.every_steps == TSR_EVERY_AUTO && c.checkpoint.mtbf_hours == 12,
         "checkpoint.every_steps = 'auto' with mtbf_hours", errbuf);
  const char *ov[] = {"checkpoint.every_steps=auto", "checkpoint.mtbf_hours=2",
                      "checkpoint.every_steps=25"};
  rc = parse(&c, "", 2, (char **)ov, 1);
  ok = rc == 0 && c.checkpoint.every_steps == TSR_EVERY_AUTO;
  rc = parse(&c, "&checkpoint every_steps = 'auto' mtbf_hours = 1 /", 1, (char **)ov + 2, 1);
  result(ok && rc == 0 && c.checkpoint.every_steps == 25,
         "every_steps on the command line: a bare auto, and a number over the deck's 'auto'",
         errbuf);
  rc = parse(&c, "", 0, NULL, 1);
  result(rc == 0 && c.checkpoint.async == TSR_LOGI_AUTO && c.checkpoint.every_steps == 0 &&
         c.checkpoint.mtbf_hours == 0 && c.hardware.fs_gbps == 5,
         "defaults: checkpoint.async 'auto', every_steps 0, mtbf_hours 0, hardware.fs_gbps 5",
         errbuf);
  /* checkpoint.async: a logical or 'auto', in a deck (quoted or bare) and on the command line */
  const char *av[] = {"checkpoint.async=auto", "checkpoint.async=.false.", "checkpoint.async=T"};
  int got[5];
  rc = parse(&c, "&checkpoint async = 'Auto' /", 0, NULL, 1);
  got[0] = rc == 0 ? c.checkpoint.async : -9;
  rc = parse(&c, "&checkpoint async = .false. /", 1, (char **)av, 1);
  got[1] = rc == 0 ? c.checkpoint.async : -9;
  rc = parse(&c, "&checkpoint async = auto /", 1, (char **)av + 1, 1);
  got[2] = rc == 0 ? c.checkpoint.async : -9;
  rc = parse(&c, "", 1, (char **)av + 2, 1);
  got[3] = rc == 0 ? c.checkpoint.async : -9;
  rc = parse(&c, "&checkpoint async = sometimes /", 0, NULL, 1);
  got[4] = rc != 0 && strstr(errbuf, "async expects a logical (.true. or .false., T or F) or "
                                     "'auto', got 'sometimes'") != NULL;
  result(got[0] == TSR_LOGI_AUTO && got[1] == TSR_LOGI_AUTO && got[2] == 0 && got[3] == 1 &&
             got[4] == 1,
         "checkpoint.async: 'auto' and auto in a deck and an override, .false. and T, and "
         "another word refused naming the three",
         errbuf);
}

/* ---------------------------------------------------------------- round trip */

/* Where the data globs were given is not a value: a deck read back has other places. */
static void forget_places(tsr_config *c) {
  memset(c->data.train_at, 0, sizeof c->data.train_at);
  memset(c->data.valid_at, 0, sizeof c->data.valid_at);
}

static void test_round_trip(void) {
  const char *ov[] = {"optim.weight_decay=0.30000000000000004", "model.init_std=0.0123456789012345678",
                      "run.name='q''uote \"dq\" ! & /'", "optim.min_lr=1e-300", "run.step_timeout_s=1.5e6",
                      "data.train=data/*.bin", "model.tie_embeddings=.true.", "run.seed=+7",
                      "checkpoint.every_steps=auto", "checkpoint.mtbf_hours=0.25"};
  tsr_config a, b;
  int rc = parse(&a, "&model n_layer = 3 /", 10, (char **)ov, 1);
  size_t need = tsr_deck_write(&a, NULL, 0);
  char *text = malloc(need);
  size_t got = tsr_deck_write(&a, text, need);
  int rc2 = parse(&b, text, strlen(text), NULL, 1);
  forget_places(&a);
  forget_places(&b);
  int ok = rc == 0 && rc2 == 0 && got == need && strlen(text) + 1 == need &&
           !memcmp(&a, &b, sizeof a);
  result(ok, "write -> parse round trip is identical (memcmp)", errbuf);
  if (!ok) printf("%s\n", text);

  char small[40];
  got = tsr_deck_write(&a, small, sizeof small);
  result(got == need && strlen(small) == sizeof small - 1 && !strncmp(small, text, sizeof small - 1),
         "write into a short buffer truncates, NUL-terminates and returns the size needed", NULL);
  free(text);
}

/* ---------------------------------------------------------------- schema covers config.h */

typedef struct {
  const char *key;
  size_t off, size;
  char type; /* i int64, r double, l logical (value T or F: a default's opposite), s string,
              * c choice (a word other than the default), n shard_scope 'node' */
  const char *value;
} field;
#define F(g, f, t, v) {#g "." #f, offsetof(tsr_config, g.f), sizeof(((tsr_config *)0)->g.f), t, v}
/* a list key (S strings, R reals): its field f, and n_k its count */
#define FL(g, k, f, t, v)                                                                     \
  {#g "." #k, offsetof(tsr_config, g.f), sizeof(((tsr_config *)0)->g.f), t, v}
/* the fields list keys fill besides their values: their counts and where they were given */
#define X(g, f) {offsetof(tsr_config, g.f), sizeof(((tsr_config *)0)->g.f)}
static const struct {
  size_t off, size;
} list_extras[] = {X(data, n_train),     X(data, n_weights),       X(data, n_names),
                   X(data, n_valid),     X(data, n_valid_weights), X(data, n_valid_names),
                   X(data, train_at),    X(data, valid_at)};
static const field fields[] = {
    F(run, name, 's', "zz"), F(run, out_dir, 's', "zz"), F(run, seed, 'i', "2"),
    F(run, max_steps, 'i', "2"), F(run, log_every, 'i', "2"), F(run, eval_every, 'i', "2"),
    F(run, eval_steps, 'i', "2"), F(run, step_timeout_s, 'r', "0.5"),
    F(run, heartbeat_s, 'r', "0.5"),
    F(run, device, 'c', "cuda"), F(run, gpu_share, 'l', "T"), F(run, sample_every, 'i', "2"),
    F(run, sample_prompt, 's', "zz"),
    F(model, arch, 'c', "gpt2"), F(model, n_layer, 'i', "2"), F(model, d_model, 'i', "2"),
    F(model, n_head, 'i', "2"), F(model, n_kv_head, 'i', "2"), F(model, d_ff, 'i', "2"),
    F(model, vocab_size, 'i', "2"), F(model, seq_len, 'i', "2"), F(model, rope_theta, 'r', "0.5"),
    F(model, max_positions, 'i', "2"), F(model, rope_scaling, 'c', "llama3"),
    F(model, rope_factor, 'r', "0.5"), F(model, rope_low_freq_factor, 'r', "0.5"),
    F(model, rope_high_freq_factor, 'r', "0.5"), F(model, rope_original_context, 'i', "2"),
    F(model, norm_eps, 'r', "0.5"), F(model, tie_embeddings, 'l', "T"),
    F(model, init_std, 'r', "0.5"), F(parallel, tp, 'i', "2"), F(parallel, pp, 'i', "2"),
    F(parallel, zero_stage, 'i', "2"), F(parallel, shard_scope, 'n', "node"),
    F(parallel, ranks_per_node, 'i', "2"), F(parallel, schedule, 'c', "gpipe"),
    F(parallel, micro_batches, 'i', "2"), F(parallel, virtual_stages, 'i', "2"),
    F(parallel, stage_layers, 's', "zz"),
    F(parallel, sequence_parallel, 'l', "T"), F(parallel, inter_node, 'c', "nccl"),
    F(parallel, mpi_gpu, 'c', "staged"), F(parallel, cp, 'i', "2"),
    F(parallel, cp_comm, 'c', "a2a"), F(parallel, offload, 'c', "optimizer"),
    F(parallel, offload_fraction, 'r', "0.5"), F(train, activation_offload, 'l', "T"),
    F(train, deterministic, 'l', "F"), F(train, micro_batch, 'i', "2"),
    F(train, global_batch, 'i', "2"), F(train, precision, 'c', "bf16"),
    F(train, recompute, 'c', "full"), F(train, grad_clip, 'r', "0.5"), F(optim, lr, 'r', "0.5"),
    F(train, loss_scale, 'r', "0.5"), F(train, loss_scale_window, 'i', "2"),
    F(train, min_loss_scale, 'r', "0.5"), F(train, xent_chunk_tokens, 'i', "2"),
    F(optim, min_lr, 'r', "0.5"), F(optim, warmup_steps, 'i', "2"), F(optim, decay, 'c', "wsd"),
    F(optim, decay_steps, 'i', "2"), F(optim, wsd_decay_frac, 'r', "0.5"),
    F(optim, beta1, 'r', "0.5"), F(optim, beta2, 'r', "0.5"), F(optim, eps, 'r', "0.5"),
    F(optim, weight_decay, 'r', "0.5"), FL(data, train, train_glob, 'S', "zz"),
    FL(data, weights, weights, 'R', "0.5"), FL(data, names, names, 'S', "zz"),
    FL(data, valid, valid_glob, 'S', "zz"), FL(data, valid_weights, valid_weights, 'R', "0.5"),
    FL(data, valid_names, valid_names, 'S', "zz"),
    F(data, shuffle, 'l', "F"), F(data, document_mask, 'l', "T"), F(data, eos_id, 'i', "2"),
    F(data, mean_doc_tokens, 'i', "2"), F(checkpoint, dir, 's', "zz"), F(checkpoint, every_steps, 'i', "2"),
    F(checkpoint, every_minutes, 'r', "0.5"), F(checkpoint, keep, 'i', "2"),
    F(checkpoint, resume, 's', "zz"), F(checkpoint, init_from, 's', "zz"),
    F(checkpoint, save_initial, 'l', "T"),
    F(checkpoint, save_last, 'l', "F"),
    F(checkpoint, mpiio_hints, 's', "a=b"), F(checkpoint, alignment, 'i', "2"),
    F(checkpoint, async, 'l', "F"), F(checkpoint, mtbf_hours, 'r', "0.5"),
    F(hardware, name, 'c', "a100"), F(hardware, peak_tflops, 'r', "0.5"),
    F(hardware, peak_fp32_tflops, 'r', "0.5"),
    F(hardware, hbm_gb, 'r', "0.5"), F(hardware, hbm_gbps, 'r', "0.5"),
    F(hardware, intra_node_gbps, 'r', "0.5"), F(hardware, inter_node_gbps, 'r', "0.5"),
    F(hardware, gpus_per_node, 'i', "2"), F(hardware, compute_efficiency, 'r', "0.5"),
    F(hardware, comm_efficiency, 'r', "0.5"), F(hardware, reserved_gb, 'r', "0.5"),
    F(hardware, fs_gbps, 'r', "0.5"), F(hardware, host_memory_gb, 'r', "0.5"),
    F(hardware, pcie_gbps, 'r', "0.5"), F(hardware, cpu_cores, 'i', "2"),
    F(hardware, cpu_adam_gbps, 'r', "0.5"), F(hardware, host_mem_gbps, 'r', "0.5"),
    F(hardware, implementation, 'c', "reference"), F(hardware, gemm_efficiency, 'r', "0.5"),
    F(hardware, gemm_fp32_efficiency, 'r', "0.5"), F(hardware, gemm_half_dim, 'r', "0.5"),
    F(hardware, attention_efficiency, 'r', "0.5"),
    F(hardware, attention_bwd_efficiency, 'r', "0.5"),
    F(hardware, attention_fp32_efficiency, 'r', "0.5"),
    F(hardware, attention_fp32_bwd_efficiency, 'r', "0.5"),
    F(hardware, attention_half_seq, 'r', "0.5"), F(hardware, attention_half_hd, 'r', "0.5"),
    F(hardware, memory_efficiency, 'r', "0.5"), F(hardware, kernel_us, 'r', "0.5"),
    F(hardware, intra_node_efficiency, 'r', "0.5"), F(hardware, inter_node_efficiency, 'r', "0.5"),
    F(hardware, intra_node_latency_us, 'r', "0.5"), F(hardware, inter_node_latency_us, 'r', "0.5"),
    F(hardware, tp_overlap, 'r', "0.5"), F(hardware, gather_overlap, 'r', "0.5"),
};

static void test_schema_covers_config(void) {
  /* Every byte of tsr_config not in the list above must be alignment padding (< 8 bytes). */
  unsigned char covered[sizeof(tsr_config)] = {0};
  size_t n = sizeof fields / sizeof fields[0];
  for (size_t i = 0; i < n; i++) memset(covered + fields[i].off, 1, fields[i].size);
  for (size_t i = 0; i < sizeof list_extras / sizeof list_extras[0]; i++)
    memset(covered + list_extras[i].off, 1, list_extras[i].size);
  int ok = 1;
  size_t gap = 0;
  for (size_t i = 0; i < sizeof covered; i++) {
    gap = covered[i] ? 0 : gap + 1;
    if (gap >= 8) ok = 0;
  }
  result(ok, "the field list of this test covers all of config.h", NULL);

  /* Each key reaches exactly its own field, and appears in --help-deck and the written deck. */
  tsr_config dflt;
  tsr_deck_defaults(&dflt);
  size_t wlen = tsr_deck_write(&dflt, NULL, 0);
  char *written = malloc(wlen), *help = NULL;
  size_t hlen = 0;
  FILE *h = open_memstream(&help, &hlen);
  tsr_deck_help(h);
  fclose(h);
  tsr_deck_write(&dflt, written, wlen);
  int bad_keys = 0;
  for (size_t i = 0; i < n; i++) {
    char ov[128], line[64];
    tsr_config c;
    snprintf(ov, sizeof ov, "%s=%s", fields[i].key, fields[i].value);
    char *ovp = ov;
    parse(&c, "", 1, &ovp, 1); /* cross-field errors are expected; the value is still set */
    const char *p = (const char *)&c + fields[i].off;
    int got = fields[i].type == 'i'   ? *(const int64_t *)p == 2
              : fields[i].type == 'r' ? *(const double *)p == 0.5
              : fields[i].type == 'l' ? *(const int *)p == (fields[i].value[0] == 'T')
              : fields[i].type == 'c' ? *(const int *)p != *(const int *)((const char *)&dflt +
                                                                            fields[i].off) &&
                                            !strcmp(tsr_deck_word(&c, p), fields[i].value)
              : fields[i].type == 'n' ? *(const int64_t *)p == TSR_SHARD_NODE
              : fields[i].type == 'R' ? *(const double *)p == 0.5
                                      : !strcmp(p, fields[i].value);
    /* and nothing else moved (but a glob's default name, and where it was given; gpt2's
     * head, tied when the deck does not say) */
    memcpy((char *)&c + fields[i].off, (const char *)&dflt + fields[i].off, fields[i].size);
    if (!strcmp(fields[i].key, "model.arch")) c.model.tie_embeddings = dflt.model.tie_embeddings;
    if (fields[i].type == 'S' || fields[i].type == 'R') {
      memcpy(c.data.names, dflt.data.names, sizeof c.data.names);
      memcpy(c.data.valid_weights, dflt.data.valid_weights, sizeof c.data.valid_weights);
      memcpy(c.data.valid_names, dflt.data.valid_names, sizeof c.data.valid_names);
      memcpy(c.data.train_at, dflt.data.train_at, sizeof c.data.train_at);
      memcpy(c.data.valid_at, dflt.data.valid_at, sizeof c.data.valid_at);
    }
    got = got && !memcmp(&c, &dflt, sizeof c);
    const char *dot = strchr(fields[i].key, '.');
    snprintf(line, sizeof line, "\n  %s ", dot + 1);
    if (!got || !strstr(help, line) || !strstr(written, line)) {
      printf("    key %s: field %s, help %s, written %s\n", fields[i].key, got ? "ok" : "WRONG",
             strstr(help, line) ? "ok" : "MISSING", strstr(written, line) ? "ok" : "MISSING");
      bad_keys++;
    }
  }
  int lines = 0;
  for (const char *q = written; (q = strstr(q, " = ")); q++) lines++;
  result(bad_keys == 0 && lines == (int)n,
         "every config.h field has a key that sets exactly it, in --help-deck and in the written deck",
         NULL);
  free(written);
  free(help);
}

/* ---------------------------------------------------------------- shipped decks */

static void test_shipped_decks(void) {
  const char *top = getenv("top_srcdir") ? getenv("top_srcdir") : ".";
  struct {
    const char *name;
    int world_size;
  } decks[] = {{"tiny", 1},      {"gpt2_124m", 1}, {"gpt2_124m", 8}, {"llama1b", 8},
               {"llama1b", 16}, {"llm7b", 8},      {"llm7b", 64},    {"llm70b", 512},
               {"llm70b", 64}};
  for (size_t i = 0; i < sizeof decks / sizeof decks[0]; i++) {
    char path[4096], what[256];
    snprintf(path, sizeof path, "%s/input/%s.nml", top, decks[i].name);
    FILE *f = fopen(path, "rb");
    char *text = malloc(1 << 20);
    size_t len = f ? fread(text, 1, (1 << 20) - 1, f) : 0;
    if (f) fclose(f);
    tsr_config c;
    memset(&c, 0, sizeof c);
    int rc = f ? tsr_deck_parse(&c, text, len, path, 0, NULL, decks[i].world_size, errbuf, sizeof errbuf)
               : -1;
    snprintf(what, sizeof what, "input/%s.nml parses and validates with world size %d",
             decks[i].name, decks[i].world_size);
    result(rc == 0, what, f ? errbuf : "cannot open");
    if (rc == 0 && !strcmp(decks[i].name, "llm70b")) {
      int ok = c.model.n_layer == 80 && c.model.d_model == 8192 && c.model.n_kv_head == 8 &&
               c.parallel.tp == 4 && c.parallel.pp == 8 && c.parallel.virtual_stages == 2 &&
               c.parallel.sequence_parallel && c.parallel.shard_scope == TSR_SHARD_GLOBAL &&
               c.optim.lr == 1.5e-4 && c.checkpoint.every_steps == 250;
      result(ok, "input/llm70b.nml has the LLaMA-2 70B shapes and layout", NULL);
    }
    if (rc == 0 && !strcmp(decks[i].name, "tiny")) {
      int ok = c.model.n_kv_head == 2 && c.run.max_steps == 300 && c.data.shuffle &&
               !strcmp(c.data.train_glob[0], "data/fortunes/train_*.bin") && c.optim.lr == 3e-3;
      result(ok, "input/tiny.nml has the demo settings", NULL);
    }
    free(text);
  }
  /* the same 70B deck on one rank: the layout check names tp and pp */
  char path[4096];
  snprintf(path, sizeof path, "%s/input/llm70b.nml", top);
  tsr_config c;
  int rc = tsr_deck_load(&c, path, 0, NULL, 1);
  result(rc == TSR_ERR_INPUT, "input/llm70b.nml on 1 rank is rejected (tp*pp = 64)", NULL);
  rc = tsr_deck_load(&c, "/nonexistent/deck.nml", 0, NULL, 1);
  result(rc == TSR_ERR_INPUT, "tsr_deck_load of a missing file returns TSR_ERR_INPUT", NULL);
}

/* ---------------------------------------------------------------- limits */

static void test_limits(void) {
  /* many errors: capped, still NUL-terminated, never overflows a small buffer */
  char deck[4096] = "&model\n";
  for (int i = 0; i < 60; i++) strcat(deck, " x = 1\n");
  strcat(deck, "/\n");
  tsr_config c;
  int rc = parse(&c, deck, 0, NULL, 1);
  int lines = 0;
  for (const char *p = errbuf; *p; p++) lines += *p == '\n';
  result(rc == TSR_ERR_INPUT && lines == 21 && strstr(errbuf, "too many errors"),
         "errors are capped at 20 plus a 'too many errors' line", errbuf);
  char tiny_buf[16];
  memset(&c, 0, sizeof c);
  rc = tsr_deck_parse(&c, deck, strlen(deck), "t.nml", 0, NULL, 1, tiny_buf, sizeof tiny_buf);
  result(rc == TSR_ERR_INPUT && strlen(tiny_buf) == sizeof tiny_buf - 1, "a short errbuf is truncated safely", NULL);
  /* text without a terminating NUL: the parser must stop at len */
  const char full[] = "&model n_layer = 12 /";
  rc = parse(&c, "", 0, NULL, 1);
  memset(&c, 0, sizeof c);
  rc = tsr_deck_parse(&c, full, 19, "t.nml", 0, NULL, 1, errbuf, sizeof errbuf);
  result(rc == TSR_ERR_INPUT && c.model.n_layer == 12 && has_error(errbuf, "t.nml:1:1", "not closed"),
         "only len bytes are read", errbuf);
}

int main(void) {
  test_stage_layers();
  test_bad_decks();
  test_overrides();
  test_good_syntax();
  test_round_trip();
  test_schema_covers_config();
  test_shipped_decks();
  test_limits();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
