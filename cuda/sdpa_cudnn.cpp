/* sdpa_cudnn.cpp — causal grouped-query attention through cuDNN's fused scaled-dot-product
 * attention (its flash-attention engines), built with NVIDIA's cuDNN frontend (the
 * header-only C++ graph API over cuDNN's backend descriptors; tools/fetch-cudnn-frontend.sh).
 * Compiled only where configure found cuDNN and the frontend (TSR_HAVE_CUDNN); selected with
 * TSR_CUDA_ATTENTION=cudnn (cuda/ops_dev.c), the kernels of attention.cu otherwise.
 *
 * cuDNN's attention takes 16-bit tensors; ours are fp32 containers (bf16 values in bf16
 * training).  So each call copies its inputs to bf16 in the staging buffer the caller gives
 * (tsr_ops_cudnn_attention_staging_elems), runs cuDNN's graph on the copies and copies the
 * results back:
 *   forward:  q, k, v -> bf16;  O (bf16) -> out;  Stats (fp32, written straight into lse)
 *   backward: q, k, v, out, dout -> bf16;  dQ, dK, dV (bf16) added into dq, dk, dv.
 * The staging holds, in order, Q [B,T,H,hd], K and V [B,T,KV,hd], O and dO [B,T,H,hd], dQ
 * [B,T,H,hd], dK and dV [B,T,KV,hd] (each on a 256-byte boundary), then cuDNN's workspace.
 * cuDNN's Stats is the natural log-sum-exp of the scaled scores of each row, [B,H,T,1]:
 * exactly ops.h's lse, so forward and backward pass it through without a copy.
 *
 * One graph per direction and shape, built at the first call with that shape (host work
 * and cuDNN's heuristics; later calls only execute) and kept until
 * tsr_cuda_cudnn_attention_close.  Host code only (cuDNN launches its own kernels), so the
 * C++ compiler builds it, not nvcc.  The backward asks for cuDNN's deterministic algorithm
 * first, as every other kernel here is deterministic, and takes the other one only where
 * that is not supported (said by tsr_cuda_cudnn_attention_prepare). */
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <map>
#include <memory>
#include <math.h>
#include <stdio.h>
#include <string>
#include <tuple>
#include <unordered_map>

#include <cuda_runtime_api.h>
extern "C" {
#include "ops.h" /* tsr_ops_staging_part */
#include "util.h"
}
#include "ops_cuda.h"

#define TSR_CUDA_ARG(cond)                                                                   \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      tsr_errorf_at(__FILE__, __LINE__, __func__, "%s:%d %s: invalid argument: %s", __FILE__, \
                    __LINE__, __func__, #cond);                                              \
      return TSR_ERR;                                                                        \
    }                                                                                        \
  } while (0)

namespace fe = cudnn_frontend;

namespace {

enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

typedef std::tuple<int, int, int, int, int> shape_key; /* B, T, H, KV, hd */

struct plans {
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  int64_t ws_fwd = 0, ws_bwd = 0; /* bytes of workspace each asks for */
  bool ok = false, deterministic = false;
  std::string why; /* when !ok: what cuDNN said */
};

cudnnHandle_t handle;
std::map<shape_key, plans> cache;

/* element counts of the staged copies: query-sized [B,T,H,hd] and key-sized [B,T,KV,hd] */
struct parts {
  long q, kv;
  parts(int B, int T, int H, int KV, int hd)
      : q(tsr_ops_staging_part((long)B * T * H * hd)),
        kv(tsr_ops_staging_part((long)B * T * KV * hd)) {}
  long bwd() const { return 4 * q + 4 * kv; }   /* Q K V O dO dQ dK dV */
};

/* The GPU the graphs are for: this process's (dp NULL), or one described by cuDNN's
 * device-property JSON, without a GPU (tsr_cuda_cudnn_attention_check_offline). */
struct target {
  std::shared_ptr<fe::DeviceProperties> dp;
  int sm_version = 0, sm_count = 0;
};

std::shared_ptr<fe::graph::Graph> new_graph(const target &t) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (t.dp) {
    g->set_device_properties(t.dp);
    g->set_sm_version(t.sm_version);
    g->set_sm_count(t.sm_count);
  }
  return g;
}

/* [B, heads, T, hd] over compact [B, T, heads, hd] storage */
fe::graph::Tensor_attributes &bthd(fe::graph::Tensor_attributes &t, int64_t uid, int B, int T,
                                   int heads, int hd) {
  return t.set_uid(uid)
      .set_dim({B, heads, T, hd})
      .set_stride({(int64_t)T * heads * hd, hd, (int64_t)heads * hd, 1});
}
std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph &g, const char *name,
                                                    int64_t uid, int B, int T, int heads,
                                                    int hd) {
  fe::graph::Tensor_attributes t;
  t.set_name(name);
  return g.tensor(bthd(t, uid, B, T, heads, hd));
}
/* 1/sqrt(hd) formed as ops_cpu.c forms it */
float scale_of(int hd) { return (float)(1.0 / sqrt((double)hd)); }

/* Stats [B, H, T, 1] fp32: ops.h's lse */
fe::graph::Tensor_attributes &stats(fe::graph::Tensor_attributes &t, int B, int T, int H) {
  return t.set_uid(UID_STATS)
      .set_dim({B, H, T, 1})
      .set_stride({(int64_t)H * T, T, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

#define FE_TRY(what, expr)                                                                   \
  do {                                                                                       \
    auto fe_e_ = (expr);                                                                     \
    if (fe_e_.is_bad()) {                                                                    \
      why = std::string(what) + ": " + fe_e_.get_message();                                  \
      return false;                                                                          \
    }                                                                                        \
  } while (0)

/* Validates the graph, has cuDNN's heuristics pick engines and check them; then, for this
 * process's GPU, builds the plans (compiling the kernels) and reads their workspace. */
bool finish(fe::graph::Graph &g, const target &t, int64_t &ws, std::string &why) {
  FE_TRY("validate", g.validate());
  if (t.dp)
    FE_TRY("build_operation_graph", g.build_operation_graph());
  else
    FE_TRY("build_operation_graph", g.build_operation_graph(handle));
  FE_TRY("create_execution_plans", g.create_execution_plans({fe::HeurMode_t::A}));
  FE_TRY("check_support", g.check_support());
  if (t.dp) return true; /* the kernels' compilation needs the driver */
  FE_TRY("build_plans", g.build_plans());
  FE_TRY("get_workspace_size", g.get_workspace_size(ws));
  return true;
}

bool build_fwd(plans &p, const target &t, int B, int T, int H, int KV, int hd) {
  auto g = new_graph(t);
  auto Q = input(*g, "Q", UID_Q, B, T, H, hd), K = input(*g, "K", UID_K, B, T, KV, hd),
       V = input(*g, "V", UID_V, B, T, KV, hd);
  auto opt = fe::graph::SDPA_attributes()
                 .set_name("tsr_attention")
                 .set_generate_stats(true)
                 .set_attn_scale(scale_of(hd))
                 .set_causal_mask(true);
  auto [O, S] = g->sdpa(Q, K, V, opt);
  bthd(O->set_output(true), UID_O, B, T, H, hd);
  stats(S->set_output(true), B, T, H);
  if (!finish(*g, t, p.ws_fwd, p.why)) return false;
  p.fwd = g;
  return true;
}

bool build_bwd(plans &p, const target &t, int B, int T, int H, int KV, int hd,
               bool deterministic) {
  auto g = new_graph(t);
  auto Q = input(*g, "Q", UID_Q, B, T, H, hd), K = input(*g, "K", UID_K, B, T, KV, hd),
       V = input(*g, "V", UID_V, B, T, KV, hd), O = input(*g, "O", UID_O, B, T, H, hd),
       dO = input(*g, "dO", UID_DO, B, T, H, hd);
  fe::graph::Tensor_attributes s;
  s.set_name("Stats");
  auto S = g->tensor(stats(s, B, T, H));
  auto opt = fe::graph::SDPA_backward_attributes()
                 .set_name("tsr_attention_backward")
                 .set_attn_scale(scale_of(hd))
                 .set_causal_mask(true)
                 .set_deterministic_algorithm(deterministic);
  auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, S, opt);
  bthd(dQ->set_output(true), UID_DQ, B, T, H, hd);
  bthd(dK->set_output(true), UID_DK, B, T, KV, hd);
  bthd(dV->set_output(true), UID_DV, B, T, KV, hd);
  if (!finish(*g, t, p.ws_bwd, p.why)) return false;
  p.bwd = g;
  p.deterministic = deterministic;
  return true;
}

/* Both directions' graphs for a shape (p.ok false with p.why when cuDNN cannot): the
 * backward deterministic where cuDNN has it. */
void build(plans &p, const target &t, int B, int T, int H, int KV, int hd) {
  try {
    if (build_fwd(p, t, B, T, H, KV, hd)) {
      if (build_bwd(p, t, B, T, H, KV, hd, true))
        p.ok = true;
      else {
        const std::string first = p.why;
        p.ok = build_bwd(p, t, B, T, H, KV, hd, false);
        if (!p.ok) p.why = "deterministic backward: " + first + "; other backward: " + p.why;
      }
    }
  } catch (const std::exception &e) { /* the frontend's JSON and containers may throw */
    p.ok = false;
    p.why = std::string("exception: ") + e.what();
  }
  if (!p.ok) p.fwd.reset(), p.bwd.reset();
}

/* The shape's plans on this GPU, built at the first call. */
plans *plans_for(int B, int T, int H, int KV, int hd) {
  const shape_key key(B, T, H, KV, hd);
  auto it = cache.find(key);
  if (it != cache.end()) return &it->second;
  plans &p = cache[key];
  build(p, target(), B, T, H, KV, hd);
  return &p;
}

bool execute(const std::shared_ptr<fe::graph::Graph> &g,
             std::unordered_map<int64_t, void *> &pack, void *ws, const char *what) {
  fe::error_t e;
  try {
    e = g->execute(handle, pack, ws);
  } catch (const std::exception &x) {
    e = fe::error_t(fe::error_code_t::GRAPH_EXECUTION_FAILED, x.what());
  }
  if (e.is_bad()) {
    tsr_errorf_at(__FILE__, __LINE__, what, "cuDNN attention %s: %s", what,
                  e.get_message().c_str());
    return false;
  }
  return true;
}

} // namespace

#define CUDNN_CHECK(expr)                                                                    \
  do {                                                                                       \
    cudnnStatus_t st_ = (expr);                                                              \
    if (st_ != CUDNN_STATUS_SUCCESS) {                                                       \
      tsr_errorf_at(__FILE__, __LINE__, __func__, "%s:%d %s: %s: %s", __FILE__, __LINE__,     \
                    __func__, #expr, cudnnGetErrorString(st_));                               \
      return TSR_ERR;                                                                        \
    }                                                                                        \
  } while (0)

extern "C" long tsr_cuda_cudnn_attention_version(void) { return (long)cudnnGetVersion(); }

/* bf16 elements of staging the shape's copies and its plans' workspace take */
static long staging_need(const plans &p, int B, int T, int H, int KV, int hd) {
  return parts(B, T, H, KV, hd).bwd() + (long)((std::max(p.ws_fwd, p.ws_bwd) + 1) / 2);
}

static int prepare(int B, int T, int H, int KV, int hd, long staging_elems, char *why,
                   size_t why_len) {
  if (!handle) CUDNN_CHECK(cudnnCreate(&handle));
  plans *p = plans_for(B, T, H, KV, hd);
  if (!p->ok) {
    snprintf(why, why_len, "cuDNN %ld cannot run it: %s", (long)cudnnGetVersion(),
             p->why.c_str());
    return TSR_CUDA_CUDNN_CANNOT;
  }
  std::string note;
  if (staging_need(*p, B, T, H, KV, hd) > staging_elems && p->deterministic) {
    /* the deterministic backward's workspace does not fit: the other one, where it does */
    plans q = *p;
    if (build_bwd(q, target(), B, T, H, KV, hd, false) &&
        staging_need(q, B, T, H, KV, hd) <= staging_elems) {
      note = "; the deterministic backward's workspace (" + std::to_string(p->ws_bwd) +
             " bytes) does not fit the staging";
      *p = q;
    }
  }
  const long need = staging_need(*p, B, T, H, KV, hd);
  if (need > staging_elems) {
    snprintf(why, why_len,
             "its bf16 copies and workspace need %ld bf16 elements (workspace %lld bytes), "
             "the staging holds %ld",
             need, (long long)std::max(p->ws_fwd, p->ws_bwd), staging_elems);
    return TSR_CUDA_CUDNN_CANNOT;
  }
  snprintf(why, why_len, "cuDNN %ld, %s backward, workspace %lld + %lld bytes%s",
           (long)cudnnGetVersion(), p->deterministic ? "deterministic" : "NON-deterministic",
           (long long)p->ws_fwd, (long long)p->ws_bwd, note.c_str());
  return 0;
}

extern "C" int tsr_cuda_cudnn_attention_prepare(int B, int T, int H, int KV, int hd,
                                                long staging_elems, char *why, size_t why_len) {
  TSR_CUDA_ARG(B > 0 && T > 0 && KV > 0 && H % KV == 0 && hd > 0);
  if (why_len) why[0] = 0;
  try {
    return prepare(B, T, H, KV, hd, staging_elems, why, why_len);
  } catch (const std::exception &e) { /* C callers: no exception crosses */
    tsr_error("cuDNN attention: %s", e.what());
    return TSR_ERR;
  }
}

/* The plans of a prepared shape whose copies and workspace fit the staging, or NULL after
 * reporting why not (the caller decides before the first call: prepare). */
static const plans *ready(int B, int T, int H, int KV, int hd, long staging_elems) {
  char why[512];
  const int rc = tsr_cuda_cudnn_attention_prepare(B, T, H, KV, hd, staging_elems, why, sizeof why);
  if (rc == TSR_CUDA_CUDNN_CANNOT)
    tsr_error("cuDNN attention: B %d T %d H %d KV %d hd %d: %s", B, T, H, KV, hd, why);
  return rc ? NULL : &cache.find(shape_key(B, T, H, KV, hd))->second;
}

extern "C" int tsr_cuda_cudnn_attention_fwd(float *out, float *lse, const float *q,
                                            const float *k, const float *v, int B, int T,
                                            int H, int KV, int hd, int qkv_stride,
                                            tsr_bf16 *staging, long staging_elems,
                                            cudaStream_t stream) {
  TSR_CUDA_ARG(staging && qkv_stride >= H * hd && qkv_stride >= KV * hd);
  const plans *p = ready(B, T, H, KV, hd, staging_elems);
  if (!p) return TSR_ERR;
  const parts n(B, T, H, KV, hd);
  const long rows = (long)B * T;
  tsr_bf16 *Qb = staging, *Kb = Qb + n.q, *Vb = Kb + n.kv, *Ob = Vb + n.kv, *ws = Ob + n.q;
  TSR_CALL(tsr_cuda_cast_rows_f32_bf16(Qb, q, rows, H * hd, qkv_stride, stream));
  TSR_CALL(tsr_cuda_cast_rows_f32_bf16(Kb, k, rows, KV * hd, qkv_stride, stream));
  TSR_CALL(tsr_cuda_cast_rows_f32_bf16(Vb, v, rows, KV * hd, qkv_stride, stream));
  CUDNN_CHECK(cudnnSetStream(handle, stream));
  std::unordered_map<int64_t, void *> pack = {
      {UID_Q, Qb}, {UID_K, Kb}, {UID_V, Vb}, {UID_O, Ob}, {UID_STATS, lse}};
  if (!execute(p->fwd, pack, ws, "forward")) return TSR_ERR;
  return tsr_cuda_cast_rows_bf16_f32(out, (long)H * hd, Ob, rows, H * hd, 0, stream);
}

extern "C" int tsr_cuda_cudnn_attention_bwd(float *dq, float *dk, float *dv, const float *dout,
                                            const float *out, const float *lse, const float *q,
                                            const float *k, const float *v, int B, int T,
                                            int H, int KV, int hd, int qkv_stride,
                                            tsr_bf16 *staging, long staging_elems,
                                            cudaStream_t stream) {
  TSR_CUDA_ARG(staging && qkv_stride >= H * hd && qkv_stride >= KV * hd);
  const plans *p = ready(B, T, H, KV, hd, staging_elems);
  if (!p) return TSR_ERR;
  const parts n(B, T, H, KV, hd);
  const long rows = (long)B * T;
  tsr_bf16 *Qb = staging, *Kb = Qb + n.q, *Vb = Kb + n.kv, *Ob = Vb + n.kv, *dOb = Ob + n.q,
           *dQb = dOb + n.q, *dKb = dQb + n.q, *dVb = dKb + n.kv, *ws = dVb + n.kv;
  TSR_CALL(tsr_cuda_cast_rows_f32_bf16(Qb, q, rows, H * hd, qkv_stride, stream));
  TSR_CALL(tsr_cuda_cast_rows_f32_bf16(Kb, k, rows, KV * hd, qkv_stride, stream));
  TSR_CALL(tsr_cuda_cast_rows_f32_bf16(Vb, v, rows, KV * hd, qkv_stride, stream));
  TSR_CALL(tsr_cuda_cast_rows_f32_bf16(Ob, out, rows, H * hd, (long)H * hd, stream));
  TSR_CALL(tsr_cuda_cast_rows_f32_bf16(dOb, dout, rows, H * hd, (long)H * hd, stream));
  CUDNN_CHECK(cudnnSetStream(handle, stream));
  std::unordered_map<int64_t, void *> pack = {
      {UID_Q, Qb},     {UID_K, Kb},   {UID_V, Vb},   {UID_O, Ob},  {UID_DO, dOb},
      {UID_STATS, (void *)lse}, {UID_DQ, dQb}, {UID_DK, dKb}, {UID_DV, dVb}};
  if (!execute(p->bwd, pack, ws, "backward")) return TSR_ERR;
  if (dq) TSR_CALL(tsr_cuda_cast_rows_bf16_f32(dq, qkv_stride, dQb, rows, H * hd, 1, stream));
  if (dk) TSR_CALL(tsr_cuda_cast_rows_bf16_f32(dk, qkv_stride, dKb, rows, KV * hd, 1, stream));
  if (dv) TSR_CALL(tsr_cuda_cast_rows_bf16_f32(dv, qkv_stride, dVb, rows, KV * hd, 1, stream));
  return 0;
}

extern "C" int tsr_cuda_cudnn_attention_check_offline(const char *device_json, int sm_version,
                                                      int sm_count, int B, int T, int H, int KV,
                                                      int hd, char *why, size_t why_len) {
  TSR_CUDA_ARG(device_json && B > 0 && T > 0 && KV > 0 && H % KV == 0 && hd > 0);
  if (why_len) why[0] = 0;
  target t;
  t.sm_version = sm_version;
  t.sm_count = sm_count;
  t.dp = std::make_shared<fe::DeviceProperties>();
  const std::string js(device_json);
  const std::vector<uint8_t> buf(js.begin(), js.end());
  fe::error_t e;
  try {
    e = t.dp->deserialize(buf);
  } catch (const std::exception &x) {
    e = fe::error_t(fe::error_code_t::INVALID_VALUE, x.what());
  }
  if (e.is_bad()) {
    snprintf(why, why_len, "cuDNN %ld: device properties: %s", (long)cudnnGetVersion(),
             e.get_message().c_str());
    return TSR_ERR;
  }
  plans p;
  build(p, t, B, T, H, KV, hd);
  snprintf(why, why_len, "cuDNN %ld: %s", (long)cudnnGetVersion(),
           p.ok ? (p.deterministic ? "deterministic backward" : "NON-deterministic backward")
                : p.why.c_str());
  return p.ok ? 0 : TSR_CUDA_CUDNN_CANNOT;
}

extern "C" void tsr_cuda_cudnn_attention_close(void) {
  cache.clear();
  if (handle) cudnnDestroy(handle);
  handle = NULL;
}
