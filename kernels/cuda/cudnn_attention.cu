// cuDNN fused causal attention (flash attention) through the backend graph API, or unmasked
// (context parallelism's ring blocks whose keys all come before their queries). The graphs
// are the ones cuDNN's runtime fusion engine recognizes as scaled-dot-product attention:
//
// forward:  S = Q K^T * scale; causal mask (row + past >= col, else -inf; past > 0 when the
//           queries are the last T of L = past + T keys: context parallelism's gathered
//           keys); M = max(S); E = exp(S - M);
//           Z = sum(E); lse = M + log(Z); O = (E / Z) V.
// backward: Delta = sum(dO * O); P = exp(S - lse) (masked); dV = P^T dO; dP = dO V^T;
//           dS = P (dP - Delta) * scale; dK = dS^T Q; dQ = dS K (accumulated in f32).
//
// Grouped-query heads broadcast in the matmuls; their dK / dV are summed over each group by a
// reduction. Our (B, T, heads, D) tensors are cuDNN's (B, heads, T, D) with permuted strides.
#include <cmath>
#include <map>
#include <tuple>
#include <vector>

#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/cudnn_graph.h"
#include "kernels/cuda/library_check.h"

namespace fsdp::kernels::cuda {
namespace {

// Ids of the tensors the caller supplies at execution.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kScale, kNegInf, kOne, kDelta, kDQAccum, kPast
};

constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;
constexpr cudnnDataType_t kBf16 = CUDNN_DATA_BFLOAT16;

using cudnn::GraphBuilder;
using cudnn::TensorRef;
using Dims = std::vector<int64_t>;

// The keys' rows: L = past + T.
int64_t keys(const AttentionDims& d) { return d.past + d.seq; }
// (B, heads, T, D) and (B, heads, L, D) dims of one of our (B, rows, heads, D) tensors.
Dims bhtd(const AttentionDims& d, int64_t heads) { return {d.batch, heads, d.seq, d.head_dim}; }
Dims bhld(const AttentionDims& d, int64_t heads) { return {d.batch, heads, keys(d), d.head_dim}; }
Dims strides_of(const HeadStrides& s) { return {s.b, s.h, s.t, 1}; }
// The transpose (B, heads, D, L) of the keys' memory.
Dims bhdl(const AttentionDims& d, int64_t heads) { return {d.batch, heads, d.head_dim, keys(d)}; }
Dims transposed_strides(const HeadStrides& s) { return {s.b, s.h, 1, s.t}; }

struct Shapes {  // dims and packed strides of the graph's intermediates
  Dims scores, scores_strides, scores_t_strides, rows, rows_strides, full, full_strides,
      full_keys, full_keys_strides;
  explicit Shapes(const AttentionDims& d) {
    const int64_t B = d.batch, H = d.heads, T = d.seq, L = keys(d), D = d.head_dim;
    scores = {B, H, T, L};
    scores_strides = {H * T * L, T * L, L, 1};
    scores_t_strides = {H * T * L, T * L, 1, L};  // (B, H, L, T) view of the same scores
    rows = {B, H, T, 1};
    rows_strides = {H * T, T, 1, 1};
    full = {B, H, T, D};
    full_strides = {H * T * D, T * D, D, 1};
    full_keys = {B, H, L, D};  // a key-side product before its sum over a head group
    full_keys_strides = {H * L * D, L * D, D, 1};
  }
};

// scores masked to the causal lower triangle: x where row + past >= col, else neg_inf (the
// mask cuDNN knows as bottom-right aligned when past > 0, with the by-value int32 offset
// kPast).
TensorRef causal_mask(GraphBuilder& g, const AttentionDims& d, const Shapes& s, TensorRef x,
                      TensorRef neg_inf) {
  TensorRef row = g.virtual_tensor(s.scores, s.scores_strides, CUDNN_DATA_INT32);
  TensorRef col = g.virtual_tensor(s.scores, s.scores_strides, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, {}, row, CUDNN_DATA_INT32, {}, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, {}, col, CUDNN_DATA_INT32, {}, 3);
  if (d.past > 0) {
    TensorRef shifted = g.virtual_tensor(s.scores, s.scores_strides, CUDNN_DATA_INT32);
    g.pointwise(CUDNN_POINTWISE_ADD, row, g.scalar(kPast, CUDNN_DATA_INT32), shifted,
                CUDNN_DATA_INT32);
    row = shifted;
  }
  TensorRef keep = g.virtual_tensor(s.scores, s.scores_strides, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, CUDNN_DATA_BOOLEAN);
  TensorRef y = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, neg_inf, y, kF32, keep);
  return y;
}

// P = softmax(scores) over each row of the (B, H, T, L) f32 scores, with its statistics
// lse = max + log(sum exp(scores - max)) written into `lse` (B, H, T, 1): the softmax cuDNN's
// flash attention recognizes. P is bf16, as the product with V reads it.
TensorRef softmax_with_stats(GraphBuilder& g, const Shapes& s, TensorRef scores, TensorRef lse) {
  TensorRef max = g.virtual_tensor(s.rows, s.rows_strides, kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, scores, max);
  TensorRef shifted = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_SUB, scores, max, shifted);
  TensorRef e = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, {}, e);
  TensorRef z = g.virtual_tensor(s.rows, s.rows_strides, kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  TensorRef log_z = g.virtual_tensor(s.rows, s.rows_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_LOG, z, {}, log_z);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_z, lse);
  TensorRef p = g.virtual_tensor(s.scores, s.scores_strides, kBf16);
  g.pointwise(CUDNN_POINTWISE_DIV, e, z, p);
  return p;
}

// Scaled scores S (B, H, T, L) f32 from Q and K^T, masked when the problem is causal (an
// unmasked block of context parallelism's ring has no mask and no -inf scalar).
TensorRef masked_scores(GraphBuilder& g, const AttentionDims& d, const Shapes& s, TensorRef q,
                        TensorRef kt, TensorRef scale, TensorRef neg_inf) {
  TensorRef raw = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.matmul(q, kt, raw);
  TensorRef scaled = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, raw, scale, scaled);
  return d.causal ? causal_mask(g, d, s, scaled, neg_inf) : scaled;
}

std::unique_ptr<cudnn::Plan> forward_plan(cudnnHandle_t handle, const AttentionDims& d) {
  GraphBuilder g(handle);
  const Shapes s(d);
  TensorRef q = g.tensor(kQ, bhtd(d, d.heads), strides_of(d.q), kBf16);
  TensorRef kt = g.tensor(kK, bhdl(d, d.kv_heads), transposed_strides(d.k), kBf16);
  TensorRef v = g.tensor(kV, bhld(d, d.kv_heads), strides_of(d.v), kBf16);
  TensorRef o = g.tensor(kO, bhtd(d, d.heads), strides_of(d.out), kBf16);
  TensorRef lse = g.tensor(kStats, s.rows, s.rows_strides, kF32);
  TensorRef scale = g.scalar(kScale, kF32);
  TensorRef neg_inf = d.causal ? g.scalar(kNegInf, kF32) : TensorRef{};

  TensorRef scores = masked_scores(g, d, s, q, kt, scale, neg_inf);
  TensorRef p = softmax_with_stats(g, s, scores, lse);
  g.matmul(p, v, o);
  return g.build();
}

// dst (B, Hkv, L, D) = a @ b summed over each group of H / Hkv query heads (or a @ b itself).
void group_sum(GraphBuilder& g, const AttentionDims& d, const Shapes& s, TensorRef a, TensorRef b,
               TensorRef dst) {
  if (d.heads == d.kv_heads) {
    g.matmul(a, b, dst);
    return;
  }
  TensorRef full = g.virtual_tensor(s.full_keys, s.full_keys_strides, kBf16);
  g.matmul(a, b, full);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, dst);
}

std::unique_ptr<cudnn::Plan> backward_plan(cudnnHandle_t handle, const AttentionDims& d) {
  GraphBuilder g(handle);
  const Shapes s(d);
  TensorRef q = g.tensor(kQ, bhtd(d, d.heads), strides_of(d.q), kBf16);
  TensorRef kt = g.tensor(kK, bhdl(d, d.kv_heads), transposed_strides(d.k), kBf16);
  TensorRef vt = g.tensor(kV, bhdl(d, d.kv_heads), transposed_strides(d.v), kBf16);
  TensorRef o = g.tensor(kO, bhtd(d, d.heads), strides_of(d.out), kBf16);
  TensorRef dout = g.tensor(kDO, bhtd(d, d.heads), strides_of(d.dout), kBf16);
  TensorRef lse = g.tensor(kStats, s.rows, s.rows_strides, kF32);
  TensorRef dq = g.tensor(kDQ, bhtd(d, d.heads), strides_of(d.dq), kBf16);
  TensorRef dk = g.tensor(kDK, bhld(d, d.kv_heads), strides_of(d.dk), kBf16);
  TensorRef dv = g.tensor(kDV, bhld(d, d.kv_heads), strides_of(d.dv), kBf16);
  TensorRef scale = g.scalar(kScale, kF32);
  TensorRef neg_inf = d.causal ? g.scalar(kNegInf, kF32) : TensorRef{};
  TensorRef one = g.scalar(kOne, kF32);
  // Scratch the engine reads back: Delta (B, H, T, 1) and dQ's f32 accumulator.
  TensorRef delta = g.tensor(kDelta, s.rows, s.rows_strides, kF32);
  TensorRef dq_acc = g.tensor(kDQAccum, s.full, s.full_strides, kF32);

  // Delta = sum over D of dO * O.
  TensorRef prod = g.virtual_tensor(s.full, s.full_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, dout, o, prod);
  TensorRef row_sum = g.virtual_tensor(s.rows, s.rows_strides, kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, row_sum);
  g.pointwise(CUDNN_POINTWISE_MUL, row_sum, one, delta);

  // P = exp(S - lse), masked.
  TensorRef raw = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.matmul(q, kt, raw);
  TensorRef scaled = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, raw, scale, scaled);
  TensorRef shifted = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, lse, shifted);
  TensorRef masked = d.causal ? causal_mask(g, d, s, shifted, neg_inf) : shifted;
  TensorRef p = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_EXP, masked, {}, p);

  // dV = P^T dO.
  TensorRef pt = g.virtual_tensor(s.scores, s.scores_t_strides, kBf16);
  g.reshape(p, pt);
  group_sum(g, d, s, pt, dout, dv);

  // dS = P (dO V^T - Delta) * scale.
  TensorRef dp = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.matmul(dout, vt, dp);
  TensorRef centered = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, delta, centered);
  TensorRef weighted = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, centered, p, weighted);
  TensorRef ds = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, weighted, scale, ds);

  // dK = dS^T Q.
  TensorRef dst = g.virtual_tensor(s.scores, s.scores_t_strides, kBf16);
  g.reshape(ds, dst);
  group_sum(g, d, s, dst, q, dk);

  // dQ = dS K, accumulated in f32, then stored.
  TensorRef k = g.virtual_tensor(bhld(d, d.kv_heads), strides_of(d.k), kBf16);
  g.reshape(kt, k);
  g.matmul(ds, k, dq_acc);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_acc, {}, dq);
  return g.build();
}

// Everything that shapes a plan: the direction, the mask, sizes and every stride (not the
// scale: it is by value).
using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           std::vector<int64_t>>;

PlanKey key_of(const AttentionDims& d, bool backward) {
  std::vector<int64_t> strides;
  for (const HeadStrides* s : {&d.q, &d.k, &d.v, &d.out})
    strides.insert(strides.end(), {s->b, s->t, s->h});
  if (backward)
    for (const HeadStrides* s : {&d.dout, &d.dq, &d.dk, &d.dv})
      strides.insert(strides.end(), {s->b, s->t, s->h});
  return {backward, d.causal, d.batch, d.seq, d.past, d.heads, d.kv_heads, d.head_dim, strides};
}

// Shape rules of the fused kernels, checked before asking cuDNN: bf16, a head size that is
// a multiple of 8 up to 128 (Hopper's fused backward), and 16-byte aligned rows.
std::string shape_refusal(const AttentionDims& d, DType dtype) {
  if (dtype != DType::bf16) return str_cat("dtype ", dtype_name(dtype), " (cuDNN attention is bf16)");
  if (d.head_dim % 8 != 0 || d.head_dim > 128) return str_cat("head_dim ", d.head_dim);
  for (const HeadStrides* s : {&d.q, &d.k, &d.v, &d.out, &d.dout, &d.dq, &d.dk, &d.dv})
    if (s->b % 8 || s->t % 8 || s->h % 8) return "strides not multiples of 8 elements";
  return "";
}

}  // namespace

struct CudnnAttention::Impl {
  Context& ctx;
  cudnnHandle_t handle = nullptr;
  std::string refusal;
  struct Entry {
    std::unique_ptr<cudnn::Plan> plan;  // null when cuDNN refused the problem
    std::string why;
  };
  std::map<PlanKey, Entry> plans;

  explicit Impl(Context& c) : ctx(c) {
    DeviceGuard guard(ctx.device());
    // A missing or unusable cuDNN is not an error: attention falls back to our kernels.
    if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) {
      handle = nullptr;
      refusal = "cuDNN could not be initialized";
    }
  }
  ~Impl() {
    plans.clear();
    if (handle) cudnnDestroy(handle);
  }

  // The plan of `d`, built on first use; null (with the reason) when cuDNN refuses it.
  const Entry& entry(const AttentionDims& d, bool backward) {
    const PlanKey key = key_of(d, backward);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Entry e;
    try {
      e.plan = backward ? backward_plan(handle, d) : forward_plan(handle, d);
    } catch (const Error& err) {
      e.why = err.what();
    }
    return plans.emplace(key, std::move(e)).first->second;
  }

  void run(const cudnn::Plan& plan, const std::vector<int64_t>& uids, std::vector<void*> ptrs,
           int64_t extra_bytes, const std::vector<size_t>& extra_offsets) {
    const int64_t bytes = (plan.workspace_bytes + 255) / 256 * 256 + extra_bytes;
    Tensor ws = ctx.empty(Shape{std::max<int64_t>(bytes, 1)}, DType::u8);
    char* base = static_cast<char*>(ws.data_ptr());
    // Our scratch tensors follow cuDNN's workspace, at 256-byte aligned offsets.
    const int64_t ours = (plan.workspace_bytes + 255) / 256 * 256;
    for (size_t i = 0; i < extra_offsets.size(); ++i)
      ptrs[ptrs.size() - extra_offsets.size() + i] = base + ours + extra_offsets[i];
    CUstream_st* stream = ctx.stream().cuda_stream();
    // Zeroed scratch: the dQ accumulator is summed into (recent cuDNN zeroes it itself;
    // older versions expect the caller to).
    if (extra_bytes > 0) FSDP_CALL(cudaMemsetAsync(base + ours, 0, size_t(extra_bytes), stream));
    FSDP_CALL(cudnnSetStream(handle, stream));
    cudnn::execute(handle, plan, uids, ptrs, base);
  }
};

CudnnAttention::CudnnAttention(Context& ctx) : impl_(std::make_unique<Impl>(ctx)) {}
CudnnAttention::~CudnnAttention() = default;

const std::string& CudnnAttention::last_refusal() const { return impl_->refusal; }

bool CudnnAttention::supports(const AttentionDims& d, DType dtype, bool backward) {
  if (!impl_->handle) return false;  // refusal set at construction
  AttentionDims shaped = d;
  if (!backward) shaped.dout = shaped.dq = shaped.dk = shaped.dv = d.out;  // unused: any legal
  const std::string why = shape_refusal(shaped, dtype);
  if (!why.empty()) {
    impl_->refusal = why;
    return false;
  }
  const Impl::Entry& e = impl_->entry(d, backward);
  if (!e.plan) impl_->refusal = e.why;
  return e.plan != nullptr;
}

bool CudnnAttention::aligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

void CudnnAttention::forward(const AttentionDims& d, void* out, float* lse, const void* q,
                             const void* k, const void* v) {
  const Impl::Entry& e = impl_->entry(d, false);
  FSDP_CHECK(e.plan, ValueError, "cuDNN attention forward: unsupported problem: ", e.why);
  float scale = float(d.scale), neg_inf = -INFINITY;
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs = {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v),
                             out, lse, &scale};
  int32_t past = int32_t(d.past);
  if (d.causal) {  // only the causal graph has the -inf scalar (and the offset when past > 0)
    uids.push_back(kNegInf);
    ptrs.push_back(&neg_inf);
    if (d.past > 0) {
      uids.push_back(kPast);
      ptrs.push_back(&past);
    }
  }
  impl_->run(*e.plan, uids, ptrs, 0, {});
}

void CudnnAttention::backward(const AttentionDims& d, void* dq, void* dk, void* dv,
                              const void* dout, const void* out, const float* lse, const void* q,
                              const void* k, const void* v) {
  const Impl::Entry& e = impl_->entry(d, true);
  FSDP_CHECK(e.plan, ValueError, "cuDNN attention backward: unsupported problem: ", e.why);
  float scale = float(d.scale), neg_inf = -INFINITY, one = 1.f;
  const size_t delta_bytes = size_t(d.batch * d.heads * d.seq) * sizeof(float);
  const size_t delta_padded = (delta_bytes + 255) / 256 * 256;
  const size_t acc_bytes = size_t(d.batch * d.heads * d.seq * d.head_dim) * sizeof(float);
  // The variant pack in the order of the graph's tensors; only the causal graph has -inf.
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale};
  std::vector<void*> ptrs = {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v),
                             const_cast<void*>(out), const_cast<void*>(dout),
                             const_cast<float*>(lse), dq, dk, dv, &scale};
  int32_t past = int32_t(d.past);
  if (d.causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&neg_inf);
    if (d.past > 0) {
      uids.push_back(kPast);
      ptrs.push_back(&past);
    }
  }
  uids.push_back(kOne);
  ptrs.push_back(&one);
  // Our scratch, placed by run(): Delta and the dQ accumulator.
  uids.insert(uids.end(), {kDelta, kDQAccum});
  ptrs.insert(ptrs.end(), {nullptr, nullptr});
  impl_->run(*e.plan, uids, ptrs, int64_t(delta_padded + acc_bytes), {0, delta_padded});
}

}  // namespace fsdp::kernels::cuda
