/* sdpa_cudnn.cpp — causal grouped-query attention through cuDNN's fused scaled-dot-product
 * attention (its flash-attention engines), built with NVIDIA's cuDNN frontend (the
 * header-only C++ graph API over cuDNN's backend descriptors; tools/fetch-cudnn-frontend.sh):
 * the graphs of sdpa_graphs.h on the op's own bf16 or fp16 tensors, read and written in
 * place (q, k, v and their gradients strided in the fused qkv buffer), and the decision
 * of cuda/context.h's tsr_cuda_cudnn_attention_prepare.  Compiled only where configure found
 * cuDNN and the frontend (TSR_HAVE_CUDNN).
 *
 * cuDNN's Stats is the natural log-sum-exp of the scaled scores of each row, [B,H,T,1]:
 * exactly ops_list.h's lse, so forward and backward pass it through without a copy.
 *
 * One pair of graphs per shape (storage type, B, T, H, KV, hd, row stride), built at the
 * first prepare with that shape (host work and cuDNN's heuristics; later calls only
 * execute) and kept until close.  Host code only (cuDNN launches its own kernels), so the
 * C++ compiler builds it, not nvcc.  The backward is cuDNN's deterministic algorithm
 * unless the caller allows otherwise (tsr_ops_shapes.deterministic 0): then the other one
 * is tried first, as the faster, and prepare says which was taken. */
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

#include "check.h"
#include "context.h"
#include "sdpa_graphs.h"

namespace fe = cudnn_frontend;

namespace {

enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

struct shape {
  tsr_dtype dt;
  int B, T, H, KV, hd, stride;
};
typedef std::tuple<int, int, int, int, int, int, int> shape_key;
shape_key key_of(const shape &s) {
  return shape_key((int)s.dt, s.B, s.T, s.H, s.KV, s.hd, s.stride);
}

struct plans {
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  int64_t ws_fwd = 0, ws_bwd = 0; /* bytes of workspace each asks for */
  bool ok = false, deterministic = false;
  int asked = -1;  /* the deterministic flag these were built for */
  std::string why; /* when !ok: what cuDNN said */
};

cudnnHandle_t handle;
std::map<shape_key, plans> cache;

/* The GPU the graphs are for: this process's (dp NULL), or one described by cuDNN's
 * device-property JSON, without a GPU (tsr_cuda_cudnn_attention_check_offline). */
struct target {
  std::shared_ptr<fe::DeviceProperties> dp;
  int sm_version = 0, sm_count = 0;
};

std::shared_ptr<fe::graph::Graph> new_graph(const target &t, tsr_dtype dt) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(dt == TSR_F16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (t.dp) {
    g->set_device_properties(t.dp);
    g->set_sm_version(t.sm_version);
    g->set_sm_count(t.sm_count);
  }
  return g;
}

/* [B, heads, T, hd] over storage with rows (b, t) of `row` elements, head h at h*hd */
fe::graph::Tensor_attributes &bthd(fe::graph::Tensor_attributes &t, int64_t uid, int B, int T,
                                   int heads, int hd, int64_t row) {
  return t.set_uid(uid).set_dim({B, heads, T, hd}).set_stride({(int64_t)T * row, hd, row, 1});
}
std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph &g, const char *name,
                                                    int64_t uid, int B, int T, int heads,
                                                    int hd, int64_t row) {
  fe::graph::Tensor_attributes t;
  t.set_name(name);
  return g.tensor(bthd(t, uid, B, T, heads, hd, row));
}
/* 1/sqrt(hd) formed as the CPU kernels form it */
float scale_of(int hd) { return (float)(1.0 / sqrt((double)hd)); }

/* Stats [B, H, T, 1] fp32: ops_list.h's lse */
fe::graph::Tensor_attributes &stats(fe::graph::Tensor_attributes &t, int B, int T, int H) {
  return t.set_uid(UID_STATS)
      .set_dim({B, H, T, 1})
      .set_stride({(int64_t)H * T, T, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

/* A step of cuDNN's frontend that declines the graph: its message becomes the reason (why)
 * and the caller answers false; not an error (check.h). */
#define TSR_CUDNN_FE_WHY(what, expr)                                                         \
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
  TSR_CUDNN_FE_WHY("validate", g.validate());
  if (t.dp)
    TSR_CUDNN_FE_WHY("build_operation_graph", g.build_operation_graph());
  else
    TSR_CUDNN_FE_WHY("build_operation_graph", g.build_operation_graph(handle));
  TSR_CUDNN_FE_WHY("create_execution_plans", g.create_execution_plans({fe::HeurMode_t::A}));
  TSR_CUDNN_FE_WHY("check_support", g.check_support());
  if (t.dp) return true; /* the kernels' compilation needs the driver */
  TSR_CUDNN_FE_WHY("build_plans", g.build_plans());
  TSR_CUDNN_FE_WHY("get_workspace_size", g.get_workspace_size(ws));
  return true;
}

bool build_fwd(plans &p, const target &t, const shape &s) {
  auto g = new_graph(t, s.dt);
  auto Q = input(*g, "Q", UID_Q, s.B, s.T, s.H, s.hd, s.stride),
       K = input(*g, "K", UID_K, s.B, s.T, s.KV, s.hd, s.stride),
       V = input(*g, "V", UID_V, s.B, s.T, s.KV, s.hd, s.stride);
  auto opt = fe::graph::SDPA_attributes()
                 .set_name("tsr_attention")
                 .set_generate_stats(true)
                 .set_attn_scale(scale_of(s.hd))
                 .set_causal_mask(true);
  auto [O, S] = g->sdpa(Q, K, V, opt);
  bthd(O->set_output(true), UID_O, s.B, s.T, s.H, s.hd, (int64_t)s.H * s.hd);
  stats(S->set_output(true), s.B, s.T, s.H);
  if (!finish(*g, t, p.ws_fwd, p.why)) return false;
  p.fwd = g;
  return true;
}

bool build_bwd(plans &p, const target &t, const shape &s, bool deterministic) {
  auto g = new_graph(t, s.dt);
  const int64_t orow = (int64_t)s.H * s.hd;
  auto Q = input(*g, "Q", UID_Q, s.B, s.T, s.H, s.hd, s.stride),
       K = input(*g, "K", UID_K, s.B, s.T, s.KV, s.hd, s.stride),
       V = input(*g, "V", UID_V, s.B, s.T, s.KV, s.hd, s.stride),
       O = input(*g, "O", UID_O, s.B, s.T, s.H, s.hd, orow),
       dO = input(*g, "dO", UID_DO, s.B, s.T, s.H, s.hd, orow);
  fe::graph::Tensor_attributes st;
  st.set_name("Stats");
  auto S = g->tensor(stats(st, s.B, s.T, s.H));
  auto opt = fe::graph::SDPA_backward_attributes()
                 .set_name("tsr_attention_backward")
                 .set_attn_scale(scale_of(s.hd))
                 .set_causal_mask(true)
                 .set_deterministic_algorithm(deterministic);
  auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, S, opt);
  bthd(dQ->set_output(true), UID_DQ, s.B, s.T, s.H, s.hd, s.stride);
  bthd(dK->set_output(true), UID_DK, s.B, s.T, s.KV, s.hd, s.stride);
  bthd(dV->set_output(true), UID_DV, s.B, s.T, s.KV, s.hd, s.stride);
  if (!finish(*g, t, p.ws_bwd, p.why)) return false;
  p.bwd = g;
  p.deterministic = deterministic;
  return true;
}

/* Both directions' graphs for a shape (p.ok false with p.why when cuDNN cannot).  The
 * backward: deterministic when asked (there is no other then); otherwise the other
 * algorithm first, the deterministic one where cuDNN has no other. */
void build(plans &p, const target &t, const shape &s, bool deterministic) {
  p = plans();
  p.asked = deterministic ? 1 : 0;
  try {
    if (build_fwd(p, t, s)) {
      if (build_bwd(p, t, s, deterministic))
        p.ok = true;
      else if (deterministic)
        p.why = "no deterministic backward: " + p.why;
      else {
        const std::string first = p.why;
        p.ok = build_bwd(p, t, s, true);
        if (!p.ok) p.why = "non-deterministic backward: " + first + "; deterministic: " + p.why;
      }
    }
  } catch (const std::exception &e) { /* the frontend's JSON and containers may throw */
    p.ok = false;
    p.why = std::string("exception: ") + e.what();
  }
  if (!p.ok) p.fwd.reset(), p.bwd.reset();
  p.asked = deterministic ? 1 : 0;
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

extern "C" long tsr_cuda_cudnn_version(void) { return (long)cudnnGetVersion(); }

static int prepare(const shape &s, int deterministic, long long ws_limit, char *why,
                   size_t why_len) {
  if (!handle) TSR_CUDNN_CALL(cudnnCreate(&handle));
  plans &p = cache[key_of(s)];
  if (p.asked != (deterministic ? 1 : 0)) build(p, target(), s, deterministic != 0);
  if (!p.ok) {
    snprintf(why, why_len, "cuDNN %ld cannot run it: %s", (long)cudnnGetVersion(),
             p.why.c_str());
    return TSR_CUDA_CUDNN_CANNOT;
  }
  const long long ws = std::max(p.ws_fwd, p.ws_bwd);
  if (ws > ws_limit) {
    snprintf(why, why_len, "its %s backward's workspace needs %lld bytes, %lld were reserved "
             "(tsr_ops_cudnn_attention_workspace_bytes)",
             p.deterministic ? "deterministic" : "non-deterministic", ws, ws_limit);
    return TSR_CUDA_CUDNN_CANNOT;
  }
  snprintf(why, why_len, "cuDNN %ld, %s backward%s, workspace %lld + %lld of %lld bytes",
           (long)cudnnGetVersion(), p.deterministic ? "deterministic" : "NON-deterministic",
           p.deterministic || deterministic ? "" : " (train.deterministic is off)",
           (long long)p.ws_fwd, (long long)p.ws_bwd, ws_limit);
  return 0;
}

extern "C" int tsr_cuda_cudnn_attention_prepare(tsr_dtype dt, int B, int T, int H, int KV,
                                                int hd, int qkv_stride, int deterministic,
                                                long long ws_limit, char *why, size_t why_len) {
  TSR_CHECK(B > 0 && T > 0 && KV > 0 && H % KV == 0 && hd > 0 && qkv_stride >= H * hd &&
                (dt == TSR_BF16 || dt == TSR_F16),
            TSR_ERR, "cuDNN attention: %s B %d T %d H %d KV %d hd %d stride %d",
            tsr_dtype_name(dt), B, T, H, KV, hd, qkv_stride);
  if (why_len) why[0] = 0;
  try {
    return prepare(shape{dt, B, T, H, KV, hd, qkv_stride}, deterministic, ws_limit, why, why_len);
  } catch (const std::exception &e) { /* C callers: no exception crosses */
    tsr_error("cuDNN attention: %s", e.what());
    return TSR_ERR;
  }
}

/* The plans of a prepared shape, or NULL after reporting it. */
static const plans *prepared(const shape &s) {
  auto it = cache.find(key_of(s));
  if (it != cache.end() && it->second.ok) return &it->second;
  tsr_error("cuDNN attention: %s B %d T %d H %d KV %d hd %d stride %d was not prepared",
            tsr_dtype_name(s.dt), s.B, s.T, s.H, s.KV, s.hd, s.stride);
  return NULL;
}

extern "C" int tsr_sdpa_graphs_fwd(tsr_dtype dt, int B, int T, int H, int KV, int hd,
                                   int qkv_stride, const void *Q, const void *K, const void *V,
                                   void *O, float *stats, void *ws, cudaStream_t stream) {
  const plans *p = prepared(shape{dt, B, T, H, KV, hd, qkv_stride});
  if (!p) return TSR_ERR;
  TSR_CUDNN_CALL(cudnnSetStream(handle, stream));
  std::unordered_map<int64_t, void *> pack = {{UID_Q, (void *)Q}, {UID_K, (void *)K},
                                              {UID_V, (void *)V}, {UID_O, O},
                                              {UID_STATS, stats}};
  return execute(p->fwd, pack, ws, "forward") ? 0 : TSR_ERR;
}

extern "C" int tsr_sdpa_graphs_bwd(tsr_dtype dt, int B, int T, int H, int KV, int hd,
                                   int qkv_stride, const void *Q, const void *K, const void *V,
                                   const void *O, const void *dO, const float *stats, void *dQ,
                                   void *dK, void *dV, void *ws, cudaStream_t stream) {
  const plans *p = prepared(shape{dt, B, T, H, KV, hd, qkv_stride});
  if (!p) return TSR_ERR;
  TSR_CUDNN_CALL(cudnnSetStream(handle, stream));
  std::unordered_map<int64_t, void *> pack = {
      {UID_Q, (void *)Q},   {UID_K, (void *)K},   {UID_V, (void *)V},
      {UID_O, (void *)O},   {UID_DO, (void *)dO}, {UID_STATS, (void *)stats},
      {UID_DQ, dQ},         {UID_DK, dK},         {UID_DV, dV}};
  return execute(p->bwd, pack, ws, "backward") ? 0 : TSR_ERR;
}

extern "C" int tsr_cuda_cudnn_attention_check_offline(const char *device_json, int sm_version,
                                                      int sm_count, tsr_dtype dt, int B, int T,
                                                      int H, int KV, int hd, int qkv_stride,
                                                      int deterministic, char *why,
                                                      size_t why_len) {
  TSR_CHECK(device_json && B > 0 && T > 0 && KV > 0 && H % KV == 0 && hd > 0 &&
                qkv_stride >= H * hd && (dt == TSR_BF16 || dt == TSR_F16),
            TSR_ERR, "cuDNN attention: %s B %d T %d H %d KV %d hd %d stride %d",
            tsr_dtype_name(dt), B, T, H, KV, hd, qkv_stride);
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
  build(p, t, shape{dt, B, T, H, KV, hd, qkv_stride}, deterministic != 0);
  snprintf(why, why_len, "cuDNN %ld: %s", (long)cudnnGetVersion(),
           p.ok ? (p.deterministic ? "deterministic backward" : "NON-deterministic backward")
                : p.why.c_str());
  return p.ok ? 0 : TSR_CUDA_CUDNN_CANNOT;
}

extern "C" void tsr_sdpa_graphs_close(void) {
  cache.clear();
  if (handle) cudnnDestroy(handle);
  handle = NULL;
}
