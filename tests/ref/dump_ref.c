/* dump_ref.c — write what tests/ref/torch_ref.py needs to check the model against PyTorch.
 *
 *   dump_ref OUT.h5 [group.key=value ...]
 *
 * Builds the model from the default deck plus the overrides, initialises it from
 * run.seed, runs one forward+backward on a seeded random batch and writes
 *   /model/<name>   initial fp32 master weights, logical shape
 *   /grad/<name>    d(mean loss)/d(param)
 *   /after/<name>   master weights after one AdamW step, done as the trainer does it
 *   /batch/inputs, /batch/targets   int32 [micro_batch, seq_len]
 * and attributes on the root group: loss, loss_after, lr, grad_norm and the model and
 * optimizer numbers the reference needs (with data.document_mask, document_mask and eos_id:
 * the batch then holds end-of-document tokens where make_batch puts them).  A singleton
 * MPI program (HDF5 is parallel). */
#include <hdf5.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "deck/deck.h"
#include "model/layout.h"
#include "model/model.h"
#include "ops/ops.h"
#include "cpu/ops_cpu.h"
#include "model/optim.h"
#include "core/util.h"

/* Every HDF5 call returns a negative value on failure. */
#define H5_CALL(expr)                                                                  \
  do {                                                                                 \
    if ((expr) < 0) {                                                                  \
      fprintf(stderr, "%s:%d: HDF5 call failed: %s\n", __FILE__, __LINE__, #expr);     \
      return TSR_ERR;                                                                  \
    }                                                                                  \
  } while (0)

static int write_dataset(hid_t group, const char *name, hid_t mem_type, hid_t file_type,
                         int ndim, const hsize_t *dims, const void *data) {
  hid_t space = H5Screate_simple(ndim, dims, NULL);
  H5_CALL(space);
  hid_t dset = H5Dcreate2(group, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5_CALL(dset);
  H5_CALL(H5Dwrite(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
  H5_CALL(H5Dclose(dset));
  H5_CALL(H5Sclose(space));
  return 0;
}

/* Every tensor of the layout from a flat buffer, as /<group>/<name>. */
static int write_tensors(hid_t file, const char *group_name, const tsr_layout *lay,
                         const float *flat) {
  hid_t group = H5Gcreate2(file, group_name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5_CALL(group);
  for (int i = 0; i < lay->n_tensors; i++) {
    const tsr_tensor *t = &lay->tensors[i];
    hsize_t dims[2] = {(hsize_t)t->shape[0], (hsize_t)t->shape[1]};
    TSR_CALL(write_dataset(group, t->name, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, t->ndim, dims,
                           flat + t->offset));
  }
  H5_CALL(H5Gclose(group));
  return 0;
}

static int attr_double(hid_t obj, const char *name, double value) {
  hid_t space = H5Screate(H5S_SCALAR);
  H5_CALL(space);
  hid_t attr = H5Acreate2(obj, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  H5_CALL(attr);
  H5_CALL(H5Awrite(attr, H5T_NATIVE_DOUBLE, &value));
  H5_CALL(H5Aclose(attr));
  H5_CALL(H5Sclose(space));
  return 0;
}

static int attr_int(hid_t obj, const char *name, int64_t value) {
  hid_t space = H5Screate(H5S_SCALAR);
  H5_CALL(space);
  hid_t attr = H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  H5_CALL(attr);
  H5_CALL(H5Awrite(attr, H5T_NATIVE_INT64, &value));
  H5_CALL(H5Aclose(attr));
  H5_CALL(H5Sclose(space));
  return 0;
}

static int attr_string(hid_t obj, const char *name, const char *value) {
  hid_t type = H5Tcopy(H5T_C_S1);
  H5_CALL(type);
  H5_CALL(H5Tset_size(type, strlen(value) + 1));
  H5_CALL(H5Tset_strpad(type, H5T_STR_NULLTERM));
  hid_t space = H5Screate(H5S_SCALAR);
  H5_CALL(space);
  hid_t attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  H5_CALL(attr);
  H5_CALL(H5Awrite(attr, type, value));
  H5_CALL(H5Aclose(attr));
  H5_CALL(H5Sclose(space));
  H5_CALL(H5Tclose(type));
  return 0;
}

static int write_config(hid_t file, const tsr_config *cfg) {
  const tsr_model_config *m = &cfg->model;
  const tsr_optim_config *o = &cfg->optim;
  TSR_CALL(attr_string(file, "arch", tsr_deck_word(cfg, &m->arch)));
  TSR_CALL(attr_int(file, "n_layer", m->n_layer));
  TSR_CALL(attr_int(file, "d_model", m->d_model));
  TSR_CALL(attr_int(file, "n_head", m->n_head));
  TSR_CALL(attr_int(file, "n_kv_head", m->n_kv_head));
  TSR_CALL(attr_int(file, "d_ff", m->d_ff));
  TSR_CALL(attr_int(file, "vocab_size", m->vocab_size));
  TSR_CALL(attr_int(file, "seq_len", m->seq_len));
  TSR_CALL(attr_double(file, "rope_theta", m->rope_theta));
  TSR_CALL(attr_string(file, "rope_scaling", tsr_deck_word(cfg, &m->rope_scaling)));
  TSR_CALL(attr_double(file, "rope_factor", m->rope_factor));
  TSR_CALL(attr_double(file, "rope_low_freq_factor", m->rope_low_freq_factor));
  TSR_CALL(attr_double(file, "rope_high_freq_factor", m->rope_high_freq_factor));
  TSR_CALL(attr_int(file, "rope_original_context", m->rope_original_context));
  TSR_CALL(attr_double(file, "norm_eps", m->norm_eps));
  TSR_CALL(attr_int(file, "tie_embeddings", m->tie_embeddings));
  TSR_CALL(attr_int(file, "micro_batch", cfg->train.micro_batch));
  TSR_CALL(attr_string(file, "precision", tsr_deck_word(cfg, &cfg->train.precision)));
  TSR_CALL(attr_string(file, "recompute", tsr_deck_word(cfg, &cfg->train.recompute)));
  TSR_CALL(attr_double(file, "grad_clip", cfg->train.grad_clip));
  TSR_CALL(attr_double(file, "beta1", o->beta1));
  TSR_CALL(attr_double(file, "beta2", o->beta2));
  TSR_CALL(attr_double(file, "eps", o->eps));
  TSR_CALL(attr_double(file, "weight_decay", o->weight_decay));
  TSR_CALL(attr_double(file, "optim_lr", o->lr));
  TSR_CALL(attr_int(file, "document_mask", cfg->data.document_mask));
  TSR_CALL(attr_int(file, "eos_id", cfg->data.eos_id));
  return 0;
}

/* Where sequence b's sample of T+1 tokens holds an end-of-document token (eos >= 0): every
 * sequence opens inside a document that began before it; b % 3 == 0 has documents of one
 * token (3, 4) and of several, and ends one on its last input (T - 1); 1 begins with one
 * (its first document is that token alone) and has another in the middle; 2 is one
 * document throughout. */
static int is_eos_at(int64_t b, int64_t t, int64_t T) {
  switch (b % 3) {
    case 0: return t == 3 || t == 4 || t == 9 || t == T - 1;
    case 1: return t == 0 || t == T / 2;
  }
  return 0;
}

/* A seeded random batch: row b of micro_batch rows is seq_len+1 ids; inputs are its first
 * seq_len, targets its last seq_len (next-token prediction, as the data loader does).  With
 * eos >= 0 (document masking) that id is only where is_eos_at puts it. */
static void make_batch(int32_t *inputs, int32_t *targets, int64_t B, int64_t T, int64_t V,
                       uint64_t seed, int64_t eos) {
  const uint64_t key = tsr_mix64(seed) ^ tsr_hash_str("dump_ref.batch");
  for (int64_t b = 0; b < B; b++) {
    for (int64_t t = 0; t <= T; t++) {
      uint64_t idx = (uint64_t)(b * (T + 1) + t);
      int32_t id = (int32_t)(tsr_mix64(key + tsr_mix64(idx)) % (uint64_t)V);
      if (eos >= 0 && id == eos) id = (int32_t)((eos + 1) % V);
      if (eos >= 0 && is_eos_at(b, t, T)) id = (int32_t)eos;
      if (t < T) inputs[b * T + t] = id;
      if (t > 0) targets[b * T + t - 1] = id;
    }
  }
}

static int run(const char *out_path, int n_overrides, char **overrides) {
  tsr_config cfg;
  char errbuf[4096] = "";
  tsr_deck_defaults(&cfg);
  if (tsr_deck_parse(&cfg, "", 0, "<empty deck>", n_overrides, overrides, 1, errbuf,
                     sizeof errbuf) != 0) {
    fprintf(stderr, "dump_ref: bad overrides:\n%s\n", errbuf);
    return TSR_ERR_INPUT;
  }
  tsr_cpu_open(0);

  tsr_layout *lay = NULL;
  TSR_CALL(tsr_layout_create(&lay, &cfg.model));
  const int64_t B = cfg.train.micro_batch, T = cfg.model.seq_len, V = cfg.model.vocab_size;
  float *master = tsr_calloc((size_t)lay->n_flat, sizeof(float));
  float *adam_m = tsr_calloc((size_t)lay->n_flat, sizeof(float));
  float *adam_v = tsr_calloc((size_t)lay->n_flat, sizeof(float));
  int32_t *inputs = tsr_calloc((size_t)(B * T), sizeof(int32_t));
  int32_t *targets = tsr_calloc((size_t)(B * T), sizeof(int32_t));
  TSR_CHECK(master && adam_m && adam_v && inputs && targets, TSR_ERR, "out of memory");

  tsr_layout_init(lay, master, (uint64_t)cfg.run.seed);
  TSR_CHECK(!cfg.data.document_mask || cfg.data.eos_id >= 0, TSR_ERR_INPUT,
            "dump_ref: data.document_mask needs data.eos_id (no shards to take it from)");
  make_batch(inputs, targets, B, T, V, (uint64_t)cfg.run.seed,
             cfg.data.document_mask ? cfg.data.eos_id : -1);

  tsr_model *model = NULL;
  tsr_model_spec spec;
  tsr_model_spec_of(&spec, &cfg);
  TSR_CALL(tsr_model_create(&model, &spec, lay));
  tsr_model_set_params(model, master);
  tsr_model_zero_grads(model);
  double loss = 0.0;
  TSR_CALL(tsr_model_fwd_bwd(model, inputs, targets, 1.0f, &loss));
  const float *grads = tsr_model_grads(model);

  hid_t file = H5Fcreate(out_path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  TSR_CHECK(file >= 0, TSR_ERR, "cannot create %s", out_path);
  TSR_CALL(write_config(file, &cfg));
  TSR_CALL(attr_double(file, "loss", loss));
  TSR_CALL(write_tensors(file, "/model", lay, master));
  TSR_CALL(write_tensors(file, "/grad", lay, grads));
  hid_t batch = H5Gcreate2(file, "/batch", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5_CALL(batch);
  hsize_t bdims[2] = {(hsize_t)B, (hsize_t)T};
  TSR_CALL(write_dataset(batch, "inputs", H5T_NATIVE_INT32, H5T_STD_I32LE, 2, bdims, inputs));
  TSR_CALL(write_dataset(batch, "targets", H5T_NATIVE_INT32, H5T_STD_I32LE, 2, bdims, targets));
  H5_CALL(H5Gclose(batch));

  /* One optimizer step exactly as the trainer takes it (step 1, fresh moments). */
  const double lr = tsr_optim_lr(&cfg.optim, cfg.run.max_steps, 1);
  const double grad_norm = sqrt(tsr_ops_sumsq_ranges(grads, (const int64_t[]){0, lay->n_params}, 1));
  const double scale = tsr_optim_clip_scale(grad_norm, cfg.train.grad_clip);
  tsr_optim_adamw(&cfg.optim, lay, master, adam_m, adam_v, grads, lr, 1, scale);
  TSR_CALL(write_tensors(file, "/after", lay, master));
  TSR_CALL(attr_double(file, "lr", lr));
  TSR_CALL(attr_double(file, "grad_norm", grad_norm));
  TSR_CALL(attr_double(file, "clip_scale", scale));

  tsr_model_set_params(model, master);
  double loss_after = 0.0;
  TSR_CALL(tsr_model_forward(model, inputs, targets, &loss_after));
  TSR_CALL(attr_double(file, "loss_after", loss_after));
  H5_CALL(H5Fclose(file));

  printf("dump_ref: %s arch=%s params=%lld loss=%.9f grad_norm=%.6e lr=%.6e loss_after=%.9f\n",
         out_path, tsr_deck_word(&cfg, &cfg.model.arch), (long long)lay->n_params, loss, grad_norm, lr, loss_after);

  tsr_model_destroy(&model);
  tsr_free(&targets);
  tsr_free(&inputs);
  tsr_free(&adam_v);
  tsr_free(&adam_m);
  tsr_free(&master);
  tsr_layout_destroy(&lay);
  return 0;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  if (argc < 2) {
    fprintf(stderr, "usage: %s OUT.h5 [group.key=value ...]\n", argv[0]);
    rc = TSR_ERR_INPUT;
  } else {
    rc = run(argv[1], argc - 2, argv + 2);
  }
  MPI_Finalize();
  return rc;
}
