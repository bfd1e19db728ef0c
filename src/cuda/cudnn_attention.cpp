// Causal attention through cuDNN's fused flash-attention engines, written against cuDNN's
// backend C API (cudnn_graph.h; no cuDNN frontend). Compiled only when CMake found cuDNN >= 9
// (src/cuda/CMakeLists.txt, ATTNRES_WITH_CUDNN).
//
// cuDNN 9.19's dedicated SDPA operations (CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR) have
// no causal mask attribute (the header offers Q, K, V, O, stats, scale, a tile-granular block
// mask, page tables and sequence lengths only), so the graphs here are the composite operation
// graphs that cuDNN's runtime fusion matches to its flash-attention kernels: matmuls, pointwise
// ops and row reductions over virtual [b, h, s, s] score tensors, with the causal mask as
// GEN_INDEX(row) >= GEN_INDEX(col) selecting -inf.
//
// Forward (per batch b and head h; S = scale * Q K^T, masked):
//   stats = max_j S + log(sum_j exp(S - max))        -> lse [B, H, T] fp32 (attnres's layout)
//   O     = (exp(S - max) / sum) V                    (probabilities in bf16 for the product)
// Backward:
//   delta = rowsum(dO * O)                            -> the caller's delta [B, H, T]
//   P = exp(S - stats) (masked); dV = P^T dO; dS = scale * P * (dO V^T - delta)
//   dK = dS^T Q; dQ = dS K  (deterministic: straight into dQ; otherwise through an fp32 dQ
//   accumulator in the workspace, which cuDNN's kernels fill with atomics)
//
// Tensor layout: q, k, v, out [B, T, H*hd] are cuDNN tensors of dims [b, h, s, d] with strides
// [T*H*hd, hd, H*hd, 1]; K^T and V^T are the same memory with the last two dims swapped.
#include "cuda/cudnn_attention.hpp"

#include <cudnn.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/check.hpp"
#include "util/error.hpp"

namespace attnres::cuda {

namespace {

// A cuDNN failure while building a plan: cuDNN cannot run this graph (the caller falls back).
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string status_text(cudnnStatus_t s) {
  char last[1024] = {};
  cudnnGetLastErrorString(last, sizeof(last));
  return concat(cudnnGetErrorString(s), " (", static_cast<int>(s), ")", last[0] != '\0' ? ": " : "", last);
}

// Plan-time calls: a failure means "no engine for this graph".
void build_check(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) throw Unsupported(concat(what, ": ", status_text(s)));
}

// Run-time calls: a failure is an error.
void run_check(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) fail("cuDNN error in ", what, ": ", status_text(s));
}

// An owned backend descriptor.
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type) {
    build_check(cudnnBackendCreateDescriptor(type, &d_), "cudnnBackendCreateDescriptor");
  }
  ~Desc() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }

  template <class T>
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* values, std::int64_t count,
            const char* what) {
    build_check(cudnnBackendSetAttribute(d_, name, type, count, values), what);
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& other, const char* what) {
    cudnnBackendDescriptor_t v = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &v, 1, what);
  }
  Desc& finalize(const char* what) {
    build_check(cudnnBackendFinalize(d_), what);
    return *this;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// The caller's tensors, by their unique ids in the graphs.
enum Uid : std::int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kOne, kdO, kdQ, kdK, kdV, kDelta, kdQAccum,
  kFirstVirtual = 100,
};

using Dims = std::array<std::int64_t, 4>;

// One operation graph under construction: its tensors and operations (all kept alive with the plan).
class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnDataType_t io) : io_(io) {}

  const Desc& tensor(std::int64_t uid, Dims dims, Dims strides, cudnnDataType_t type, bool is_virtual,
                     bool by_value = false) {
    Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const std::int64_t align = 16;
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type, 1, "tensor data type")
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4, "tensor dims")
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4, "tensor strides")
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid, 1, "tensor uid")
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &align, 1, "tensor alignment")
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual, 1, "tensor virtual");
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &by_value, 1, "tensor by value");
    t.finalize("tensor");
    keep_.push_back(std::move(t));
    return keep_.back();
  }
  const Desc& virt(Dims dims, Dims strides, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return tensor(next_uid_++, dims, strides, type, true);
  }
  const Desc& scalar(std::int64_t uid) {
    return tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, true);
  }

  // y = mode(x[, b[, t]]); axis for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc* t, const Desc& y,
                 cudnnDataType_t math = CUDNN_DATA_FLOAT, std::int64_t axis = -1) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode, 1, "pointwise mode")
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &math, 1, "pointwise precision");
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis, 1, "pointwise axis");
    pw.finalize("pointwise descriptor");
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op")
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
    if (b != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b, "pointwise b");
    if (t != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t, "pointwise t");
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y").finalize("pointwise op");
    add_op(std::move(pw), std::move(op));
  }
  // c = a b over the last two dims (fp32 accumulation).
  void matmul(const Desc& a, const Desc& b, const Desc& c) {
    Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &comp, 1, "matmul precision").finalize("matmul");
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a")
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b")
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c")
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm, "matmul op")
        .finalize("matmul op");
    add_op(std::move(mm), std::move(op));
  }
  // y [.., 1] = reduce(x) over the last dim.
  void reduction(cudnnReduceTensorOp_t mode, const Desc& x, const Desc& y) {
    Desc red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &mode, 1, "reduction mode")
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &comp, 1, "reduction precision")
        .finalize("reduction");
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x")
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y")
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red, "reduction op")
        .finalize("reduction op");
    add_op(std::move(red), std::move(op));
  }
  // y = x viewed with y's dims and strides (a transpose of the last two dims here).
  void reshape(const Desc& x, const Desc& y) {
    Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x")
        .set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y")
        .finalize("reshape op");
    add_op(Desc(), std::move(op));
  }

  // masked = (row >= col) ? s : -inf, for scores s [b, h, sq, skv] (top-left aligned causal mask).
  const Desc& causal_mask(const Desc& s, Dims dims, Dims strides, const Desc& neg_inf) {
    const Desc& row = virt(dims, strides, CUDNN_DATA_INT32);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
    const Desc& col = virt(dims, strides, CUDNN_DATA_INT32);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, CUDNN_DATA_FLOAT, 3);
    const Desc& keep = virt(dims, strides, CUDNN_DATA_BOOLEAN);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, nullptr, keep, CUDNN_DATA_BOOLEAN);
    const Desc& out = virt(dims, strides);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, &neg_inf, &keep, out);
    return out;
  }

  cudnnDataType_t io() const { return io_; }
  std::vector<Desc> take() {
    std::vector<Desc> out;
    for (Desc& d : keep_) out.push_back(std::move(d));
    keep_.clear();
    return out;
  }
  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }

 private:
  void add_op(Desc aux, Desc op) {
    if (aux.get() != nullptr) keep_.push_back(std::move(aux));
    ops_.push_back(op.get());
    keep_.push_back(std::move(op));
  }

  cudnnDataType_t io_;
  std::int64_t next_uid_ = kFirstVirtual;
  std::deque<Desc> keep_;  // a deque: the references tensor() returns stay valid
  std::vector<cudnnBackendDescriptor_t> ops_;
};

struct Layout {
  Dims qkv, qkv_strides;  // [b, h, s, d], [T*C, d, C, 1]
  Dims t, t_strides;      // K^T, V^T: [b, h, d, s]
  Dims scores, scores_strides, scores_t_strides;
  Dims stats, stats_strides;
  Dims accum_strides;  // the fp32 dQ accumulator [b, h, s, d], packed
};

Layout layout_of(const kern::AttentionShape& s) {
  const std::int64_t b = s.batch, h = s.n_heads, t = s.seq, d = s.head_dim, c = h * d;
  Layout l;
  l.qkv = {b, h, t, d};
  l.qkv_strides = {t * c, d, c, 1};
  l.t = {b, h, d, t};
  l.t_strides = {t * c, d, 1, c};
  l.scores = {b, h, t, t};
  l.scores_strides = {h * t * t, t * t, t, 1};
  l.scores_t_strides = {h * t * t, t * t, 1, t};
  l.stats = {b, h, t, 1};
  l.stats_strides = {h * t, t, 1, 1};
  l.accum_strides = {h * t * d, t * d, d, 1};
  return l;
}

// scale * Q K^T [b, h, s, s], fp32.
const Desc& scaled_scores(GraphBuilder& g, const Layout& l, const Desc& q, const Desc& kt, const Desc& scale) {
  const Desc& s0 = g.virt(l.scores, l.scores_strides);
  g.matmul(q, kt, s0);
  const Desc& s1 = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, s0, &scale, nullptr, s1);
  return s1;
}

void build_forward(GraphBuilder& g, const kern::AttentionShape& shape) {
  const Layout l = layout_of(shape);
  const Desc& q = g.tensor(kQ, l.qkv, l.qkv_strides, g.io(), false);
  const Desc& kt = g.tensor(kK, l.t, l.t_strides, g.io(), false);
  const Desc& v = g.tensor(kV, l.qkv, l.qkv_strides, g.io(), false);
  const Desc& o = g.tensor(kO, l.qkv, l.qkv_strides, g.io(), false);
  const Desc& stats = g.tensor(kStats, l.stats, l.stats_strides, CUDNN_DATA_FLOAT, false);
  const Desc& scale = g.scalar(kScale);
  const Desc& neg_inf = g.scalar(kNegInf);

  const Desc& s1 = scaled_scores(g, l, q, kt, scale);
  const Desc& s2 = g.causal_mask(s1, l.scores, l.scores_strides, neg_inf);
  // softmax with its stats: max, exp(s - max), sum, stats = max + log(sum), p = e / sum
  const Desc& mx = g.virt(l.stats, l.stats_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s2, mx);
  const Desc& sub = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, s2, &mx, nullptr, sub);
  const Desc& e = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, sub, nullptr, nullptr, e);
  const Desc& sum = g.virt(l.stats, l.stats_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  const Desc& log_sum = g.virt(l.stats, l.stats_strides);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, mx, &log_sum, nullptr, stats);
  const Desc& p = g.virt(l.scores, l.scores_strides, g.io());  // the P.V operand in the I/O type
  g.pointwise(CUDNN_POINTWISE_DIV, e, &sum, nullptr, p);
  g.matmul(p, v, o);
}

void build_backward(GraphBuilder& g, const kern::AttentionShape& shape, bool deterministic) {
  const Layout l = layout_of(shape);
  const Desc& q = g.tensor(kQ, l.qkv, l.qkv_strides, g.io(), false);
  const Desc& kt = g.tensor(kK, l.t, l.t_strides, g.io(), false);
  const Desc& vt = g.tensor(kV, l.t, l.t_strides, g.io(), false);
  const Desc& o = g.tensor(kO, l.qkv, l.qkv_strides, g.io(), false);
  const Desc& d_o = g.tensor(kdO, l.qkv, l.qkv_strides, g.io(), false);
  const Desc& stats = g.tensor(kStats, l.stats, l.stats_strides, CUDNN_DATA_FLOAT, false);
  const Desc& dq = g.tensor(kdQ, l.qkv, l.qkv_strides, g.io(), false);
  const Desc& dk = g.tensor(kdK, l.qkv, l.qkv_strides, g.io(), false);
  const Desc& dv = g.tensor(kdV, l.qkv, l.qkv_strides, g.io(), false);
  const Desc& delta = g.tensor(kDelta, l.stats, l.stats_strides, CUDNN_DATA_FLOAT, false);
  const Desc& scale = g.scalar(kScale);
  const Desc& neg_inf = g.scalar(kNegInf);
  const Desc& one = g.scalar(kOne);

  // delta = rowsum(dO * O)
  const Desc& doo = g.virt(l.qkv, l.qkv_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, d_o, &o, nullptr, doo);
  const Desc& rows = g.virt(l.stats, l.stats_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, doo, rows);
  g.pointwise(CUDNN_POINTWISE_MUL, rows, &one, nullptr, delta);
  // P = exp(scale * Q K^T - stats), masked
  const Desc& s1 = scaled_scores(g, l, q, kt, scale);
  const Desc& s2 = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, s1, &stats, nullptr, s2);
  const Desc& s3 = g.causal_mask(s2, l.scores, l.scores_strides, neg_inf);
  const Desc& p = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, s3, nullptr, nullptr, p);
  // dV = P^T dO
  const Desc& pt = g.virt(l.scores, l.scores_t_strides, g.io());
  g.reshape(p, pt);
  g.matmul(pt, d_o, dv);
  // dS = scale * P * (dO V^T - delta)
  const Desc& dp = g.virt(l.scores, l.scores_strides);
  g.matmul(d_o, vt, dp);
  const Desc& dp1 = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, &delta, nullptr, dp1);
  const Desc& ds0 = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, dp1, &p, nullptr, ds0);
  const Desc& ds = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, ds0, &scale, nullptr, ds);
  // dK = dS^T Q
  const Desc& dst = g.virt(l.scores, l.scores_t_strides, g.io());
  g.reshape(ds, dst);
  g.matmul(dst, q, dk);
  // dQ = dS K
  const Desc& k = g.virt(l.qkv, l.qkv_strides, g.io());
  g.reshape(kt, k);
  if (deterministic) {
    g.matmul(ds, k, dq);
  } else {
    const Desc& acc = g.tensor(kdQAccum, l.qkv, l.accum_strides, CUDNN_DATA_FLOAT, false);
    g.matmul(ds, k, acc);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, acc, nullptr, nullptr, dq);
  }
}

bool engine_is_nondeterministic(cudnnBackendDescriptor_t cfg) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  std::int64_t n = 0;
  build_check(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e),
              "engine of a configuration");
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  std::int64_t count = 0;
  build_check(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                       static_cast<std::int64_t>(notes.size()), &count, notes.data()),
              "engine numerical notes");
  for (std::int64_t i = 0; i < count && i < static_cast<std::int64_t>(notes.size()); ++i)
    if (notes[static_cast<std::size_t>(i)] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
  return false;
}

// One execution plan and everything its graph references.
struct Plan {
  std::vector<Desc> keep;  // tensors, operations, the graph, heuristics, configurations
  Desc plan;
  std::int64_t workspace = 0;
  std::int64_t accum_offset = -1;  // the fp32 dQ accumulator's offset in the workspace (nondeterministic)
};

}  // namespace

struct Attention::Cudnn::Impl {
  Stream stream = nullptr;
  bool deterministic = true;
  cudnnHandle_t handle = nullptr;
  // (backward, batch, seq, heads, head_dim) -> a plan, or why there is none.
  using Key = std::tuple<bool, std::int64_t, int, int, int>;
  std::map<Key, std::unique_ptr<Plan>> plans;
  std::map<Key, std::string> refusals;
  DeviceBuffer workspace;

  std::unique_ptr<Plan> build(bool backward, const kern::AttentionShape& shape) {
    auto p = std::make_unique<Plan>();
    GraphBuilder g(CUDNN_DATA_BFLOAT16);
    if (backward) build_backward(g, shape, deterministic);
    else build_forward(g, shape);
    p->keep = g.take();
    Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle, 1, "graph handle")
        .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.ops().data(),
             static_cast<std::int64_t>(g.ops().size()), "graph operations")
        .finalize("operation graph");
    std::string tried;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Desc heur;
      std::vector<Desc> cfgs;
      std::vector<cudnnBackendDescriptor_t> raw;
      std::int64_t got = 0;
      try {
        heur = Desc(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph")
            .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode, 1, "heuristics mode")
            .finalize("heuristics");
        std::int64_t count = 0;
        build_check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                    "heuristics result count");
        for (std::int64_t i = 0; i < count; ++i) {
          cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
          raw.push_back(cfgs.back().get());
        }
        if (count > 0)
          build_check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
                      "heuristics results");
      } catch (const Unsupported& e) {
        tried += concat(" [heuristics mode ", static_cast<int>(mode), ": ", e.what(), "]");
        continue;
      }
      for (std::int64_t i = 0; i < got; ++i) {
        try {
          if (backward && deterministic && engine_is_nondeterministic(raw[static_cast<std::size_t>(i)])) {
            tried += " [engine config " + std::to_string(i) + ": nondeterministic]";
            continue;
          }
          Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
          plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle, 1, "plan handle")
              .set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[static_cast<std::size_t>(i)], "plan config")
              .finalize("execution plan");
          std::int64_t n = 0;
          build_check(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                               1, &n, &p->workspace),
                      "plan workspace size");
          p->plan = std::move(plan);
          for (Desc& c : cfgs) p->keep.push_back(std::move(c));
          p->keep.push_back(std::move(heur));
          p->keep.push_back(std::move(graph));
          if (backward && !deterministic) {
            p->accum_offset = (p->workspace + 255) / 256 * 256;
            p->workspace = p->accum_offset + shape.batch * shape.seq * shape.n_heads * shape.head_dim * 4;
          }
          return p;
        } catch (const Unsupported& e) {
          tried += concat(" [engine config ", i, ": ", e.what(), "]");
        }
      }
      if (got == 0) tried += concat(" [heuristics mode ", static_cast<int>(mode), ": no engine]");
    }
    throw Unsupported("no engine can run the graph:" + tried);
  }

  Outcome run(bool backward, const kern::AttentionShape& shape, std::vector<std::pair<std::int64_t, void*>> ptrs) {
    const Key key{backward, shape.batch, shape.seq, shape.n_heads, shape.head_dim};
    if (const auto r = refusals.find(key); r != refusals.end()) return {false, false, r->second};
    auto it = plans.find(key);
    if (it == plans.end()) {
      try {
        if (handle == nullptr) {
          // A library that does not load (e.g. cuDNN's sub-libraries not on the loader's path)
          // is a refusal too: logged, and the kernels run.
          cudnnHandle_t h = nullptr;
          build_check(cudnnCreate(&h), "cudnnCreate");
          if (const cudnnStatus_t st = cudnnSetStream(h, stream); st != CUDNN_STATUS_SUCCESS) {
            cudnnDestroy(h);
            build_check(st, "cudnnSetStream");
          }
          handle = h;
        }
        it = plans.emplace(key, build(backward, shape)).first;
        // Once per shape and direction: which plan runs it (the engine's choice is cuDNN's).
        std::fprintf(stderr,
                     "attnres: cuDNN %s attention %s plan (batch %lld, seq %d, heads %d, head_dim %d): "
                     "workspace %.1f MiB%s\n",
                     version().c_str(), backward ? "backward" : "forward", static_cast<long long>(shape.batch),
                     shape.seq, shape.n_heads, shape.head_dim, static_cast<double>(it->second->workspace) / (1 << 20),
                     backward ? (deterministic ? ", deterministic" : ", nondeterministic (atomic dQ)") : "");
      } catch (const Unsupported& e) {
        refusals.emplace(key, e.what());
        return {false, true, e.what()};
      }
      if (static_cast<std::size_t>(it->second->workspace) > workspace.bytes()) {
        // A new shape: plans are built once, so this is not in a training step's loop.
        ATTNRES_CUDA_CHECK(cudaStreamSynchronize(stream));
        workspace = DeviceBuffer(static_cast<std::size_t>(it->second->workspace));
      }
    }
    const Plan& plan = *it->second;
    const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const float one = 1.0f;
    ptrs.emplace_back(kScale, const_cast<float*>(&scale));
    ptrs.emplace_back(kNegInf, const_cast<float*>(&neg_inf));
    if (backward) ptrs.emplace_back(kOne, const_cast<float*>(&one));
    if (plan.accum_offset >= 0) ptrs.emplace_back(kdQAccum, static_cast<char*>(workspace.data()) + plan.accum_offset);
    std::vector<std::int64_t> uids;
    std::vector<void*> data;
    for (const auto& [uid, ptr] : ptrs) {
      uids.push_back(uid);
      data.push_back(ptr);
    }
    void* ws = workspace.data();
    Desc pack;
    try {
      pack = Desc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
      pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), static_cast<std::int64_t>(uids.size()),
               "variant pack uids")
          .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, data.data(),
               static_cast<std::int64_t>(data.size()), "variant pack pointers")
          .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &ws, 1, "variant pack workspace")
          .finalize("variant pack");
    } catch (const Unsupported& e) {
      fail("cuDNN attention: ", e.what());
    }
    run_check(cudnnBackendExecute(handle, plan.plan.get(), pack.get()), "cudnnBackendExecute (attention)");
    return {};
  }
};

Attention::Cudnn::Cudnn(Stream stream, bool deterministic) : impl_(std::make_unique<Impl>()) {
  impl_->stream = stream;
  impl_->deterministic = deterministic;
}

Attention::Cudnn::~Cudnn() {
  if (impl_->handle != nullptr) {
    cudaStreamSynchronize(impl_->stream);
    impl_->plans.clear();
    cudnnDestroy(impl_->handle);
  }
}

std::size_t Attention::Cudnn::workspace_bytes() const { return impl_->workspace.bytes(); }

std::string Attention::Cudnn::version() {
  const std::size_t v = cudnnGetVersion();  // major * 10000 + minor * 100 + patch (cuDNN 9)
  return concat(v / 10000, ".", v / 100 % 100, ".", v % 100);
}

Attention::Cudnn::Outcome Attention::Cudnn::forward(void* out, float* lse, const void* q, const void* k,
                                                    const void* v, const kern::AttentionShape& shape) {
  return impl_->run(false, shape,
                    {{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)}, {kO, out},
                     {kStats, lse}});
}

Attention::Cudnn::Outcome Attention::Cudnn::backward(void* dq, void* dk, void* dv, const void* dout, const void* q,
                                                     const void* k, const void* v, const void* out, const float* lse,
                                                     float* delta, const kern::AttentionShape& shape) {
  return impl_->run(true, shape,
                    {{kQ, const_cast<void*>(q)},
                     {kK, const_cast<void*>(k)},
                     {kV, const_cast<void*>(v)},
                     {kO, const_cast<void*>(out)},
                     {kdO, const_cast<void*>(dout)},
                     {kStats, const_cast<float*>(lse)},
                     {kdQ, dq},
                     {kdK, dk},
                     {kdV, dv},
                     {kDelta, delta}});
}

}  // namespace attnres::cuda
