/* session.h — the objects of one run, built once and torn down once: the grid and its
 * communicators, the device backend, this rank's layout part, the model, ZeRO, the
 * pipeline schedule and executor, the data readers, the checkpointed state.  The
 * training loop (train.c) and the evaluation both work on a session.
 *
 * A session opens in this order, each owner deciding its own part: the grid checks the
 * layout and makes every communicator (grid.c); the device backend is installed before
 * anything allocates op memory (run.device); the layout is padded for ZeRO, the model is
 * created with the buffers ZeRO says it must own (tsr_zero_model_options) and as many
 * activation slots as the pipeline schedule keeps in flight; the backend reserves its
 * scratch for the model's shapes; ZeRO becomes the model's parameter and gradient
 * provider; on a GPU the groups that move device memory get their transports. */
#ifndef TSR_SESSION_H
#define TSR_SESSION_H

#include <mpi.h>
#include <stdint.h>

#include "ckpt/ckpt.h" /* tsr_train_state, tsr_ckpt_view (and config.h, layout.h) */

/* the objects a session holds, by pointer: their headers are their users' to include */
typedef struct tsr_grid tsr_grid;
typedef struct tsr_model tsr_model;
typedef struct tsr_zero tsr_zero;
typedef struct tsr_pp_schedule tsr_pp_schedule;
typedef struct tsr_pp_exec tsr_pp_exec;
typedef struct tsr_data tsr_data;
typedef struct tsr_metrics tsr_metrics;
typedef struct tsr_ops_backend tsr_ops_backend;
typedef struct tsr_ckpt_policy tsr_ckpt_policy;

typedef struct {
  const tsr_config *cfg;
  MPI_Comm world;
  int rank, world_size, dp, dp_rank;
  int dpcp; /* the ranks that sum gradients: dp x cp (the cp ranks each hold part of a sequence) */
  int64_t grad_accum_steps; /* micro-batches per step on this dp rank */
  tsr_grid *grid;
  tsr_layout *lay;
  tsr_model *model;
  tsr_zero *zero;
  tsr_pp_schedule *sched; /* pp > 1: this stage's schedule and its executor */
  tsr_pp_exec *exec;
  double *bubble; /* [pp] measured idle fraction per stage, last step */
  tsr_data *train_data; /* one dataset, or a mixture of several (data.h) */
  int n_valid;           /* validation sets (0: none), their data and normalised weights */
  tsr_data *valid_data[TSR_MAX_DATASETS];
  double valid_weight[TSR_MAX_DATASETS];
  int32_t *inputs, *targets; /* one micro-batch */
  tsr_metrics *metrics;
  tsr_train_state st;
  double flops_per_token;
  double peak_flops; /* per rank, the denominator of MFU (the slowest rank's GEMM rate) */
  int peak_raised;   /* steps ran faster than it (tsr_session_mfu): raised to theirs */
  const tsr_ops_backend *dev; /* the device the ops run on (NULL: the CPU) */
  double *loss_acc; /* op memory: a step's micro-batch losses, read once per step */
  int32_t eos;      /* data.document_mask: the end-of-document id (-1: no masking) */
  tsr_tokenizer_file *tok_files; /* rank 0, training: the data's tokenizer files, which */
  int n_tok_files;               /* every checkpoint carries (st.tokenizer_files) */
  tsr_ckpt_policy *ckpt; /* when and how checkpoints are written (ckpt_policy.h) */
} tsr_session;

/* Build every object of the run (training: also the training data and the GEMM rate).
 * Returns what every rank returns (a bad layout, deck or data file fails them all). */
int tsr_session_open(tsr_session *s, const tsr_config *cfg, MPI_Comm world, int training);
/* run.device: open the device backend over the ranks of comm and install it (*dev NULL:
 * the CPU), before anything allocates op memory; tsr_session_open's, and tessera
 * generate's on its one rank. */
int tsr_session_open_device(const tsr_config *cfg, MPI_Comm comm, const tsr_ops_backend **dev);
void tsr_session_close(tsr_session *s);

/* The newest complete checkpoint (checkpoint.resume), else the weights of
 * checkpoint.init_from (step 0, a fresh optimizer), else the seed's initialisation; then,
 * when steps are left to train, the checkpoint directory's pre-flight check
 * (tsr_ckpt_preflight) and the checkpoint writer (tsr_session_ckpt_open).  Collective; the
 * same outcome on every rank. */
int tsr_session_resume(tsr_session *s);
/* Load one checkpoint file into the state and the parameters. */
int tsr_session_load(tsr_session *s, const char *path);
/* Load only the weights (/model) of a checkpoint file, of any layout, into the parameters:
 * Adam's m and v become zero, the train state is left as it is (the file's step in *step
 * when step != NULL).  /optim need not be in the file (tools/tsr-import writes none). */
int tsr_session_load_weights(tsr_session *s, const char *path, int64_t *step);

/* This rank's optimizer state (ZeRO's master, Adam's m and v over the checkpoint view's
 * shard) as host arrays for checkpoint I/O, in hb[0..2] (NULL where there is none): on
 * the CPU the arrays themselves; on a device a page-locked host copy, fetched from the
 * device.  tsr_session_state_release copies it back to the device when `put` and frees
 * it.  TSR_ERR (reported) when the host copy cannot be allocated. */
int tsr_session_state_host(tsr_session *s, float *hb[3]);
void tsr_session_state_release(tsr_session *s, float *hb[3], int put);
/* The MFU of a step that trained tok_per_s tokens/s: the model's FLOPs per rank over the
 * GEMM rate measured at start-up.  A step faster than that rate means the probe ran while
 * the cores were busy (another job): the step's own rate, a lower bound of the peak,
 * becomes the denominator from then on (raised again by faster steps), and the log says
 * so at the first raise.  Never above 1; -1 when no rate was measured. */
double tsr_session_mfu(tsr_session *s, double tok_per_s);
/* Evaluation with data.document_mask: the end-of-document id (data.eos_id, or that of
 * the tokenizer of --tokenizer PATH when given, else of the checkpoint at ckpt_path, else
 * of the validation shards) into the model.  Collective. */
int tsr_session_eval_eos(tsr_session *s, const char *ckpt_path, const char *tokenizer);
/* Mean validation loss over run.eval_steps micro-batches (fewer when the set is
 * smaller): the first samples of each validation set, set_loss[i] of set i (may be NULL),
 * and *val_loss their total weighted by data.valid_weights; batches: each set's count. */
int tsr_session_evaluate(tsr_session *s, double *val_loss, double *set_loss, int64_t *batches);
/* The data's lines of the log at start: the training data (each dataset of a mixture
 * with its tokens, weight and the epochs the run takes of it) and the validation sets. */
void tsr_session_log_data(const tsr_session *s);
/* A mixture: its datasets' names and the samples of each consumed so far (at the
 * cursor); returns how many datasets (0: one dataset, nothing written). */
int tsr_session_set_samples(const tsr_session *s, const char **names, int64_t *samples);
/* The validation losses as the log writes them: "val loss 3.2100", or with several sets
 * "val loss 3.2100 (web 3.4000, code 2.7600)". */
void tsr_session_val_text(const tsr_session *s, double val_loss, const double *set_loss,
                          char *buf, size_t len);

/* ---- checkpoints (session_ckpt.c; docs/formats.md "Checkpoint write protocol",
 * "Asynchronous checkpoints", "Checkpoint interval") ---- */

/* What this rank holds, for checkpoint I/O (tsr_ckpt_view). */
tsr_ckpt_view tsr_session_ckpt_view(const tsr_session *s);
/* Before the first step: the run's checkpoint policy (tsr_ckpt_policy_open: synchronous or
 * background writes, logged; with every_steps = 'auto' the first checkpoint a few steps
 * on).  Collective. */
int tsr_session_ckpt_open(tsr_session *s);
/* Waits for a write in flight (reporting a failure), frees the writer. */
void tsr_session_ckpt_close(tsr_session *s);
/* Checkpoint the current step (collective): written now, or snapshot and written in the
 * background (after waiting for the write in flight, whose failure is returned); `wait`:
 * return only once it is written (the last step, a stop).  The metrics get a checkpoint
 * event when the write has ended; with 'auto' the next checkpoint step is chosen. */
int tsr_session_save(tsr_session *s, const char *deck_text, int wait);
/* At a step boundary, never blocking: the code of a background write that has ended in
 * failure (each is returned once; 0 otherwise).  The ranks may see the end at different
 * boundaries: all-reduce it (MAX) to stop together. */
int tsr_session_ckpt_poll(tsr_session *s);
/* Waits for the write in flight, if any, and returns its code (collective outcome). */
int tsr_session_ckpt_wait(tsr_session *s);
/* After every step, with the step's time: is a checkpoint due at this step
 * (checkpoint.every_steps, or the 'auto' interval)?  The same answer on every rank. */
int tsr_session_ckpt_due(tsr_session *s, double step_s);

#endif
