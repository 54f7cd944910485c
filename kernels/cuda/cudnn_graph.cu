#include "kernels/cuda/cudnn_graph.h"

#include "kernels/cuda/library_check.h"

namespace fsdp::kernels::cuda::cudnn {

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  FSDP_CALL(cudnnBackendCreateDescriptor(type, &desc_));
}

Descriptor::~Descriptor() {
  if (desc_) cudnnBackendDestroyDescriptor(desc_);  // nothing to report from a destructor
}

void Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                     int64_t count, const void* values) {
  FSDP_CALL(cudnnBackendSetAttribute(desc_, name, type, count, values));
}

void Descriptor::set_int64(cudnnBackendAttributeName_t name, const std::vector<int64_t>& v) {
  set(name, CUDNN_TYPE_INT64, int64_t(v.size()), v.data());
}

void Descriptor::set_desc(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t d) {
  set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
}

void Descriptor::finalize() { FSDP_CALL(cudnnBackendFinalize(desc_)); }

Descriptor& GraphBuilder::make(cudnnBackendDescriptorType_t type) {
  keep_.push_back(std::make_unique<Descriptor>(type));
  return *keep_.back();
}

TensorRef GraphBuilder::make_tensor(int64_t uid, const std::vector<int64_t>& dims,
                                    const std::vector<int64_t>& strides, cudnnDataType_t type,
                                    bool is_virtual, bool by_value) {
  Descriptor& t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t alignment = 16;
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  t.set_int64(CUDNN_ATTR_TENSOR_DIMENSIONS, dims);
  t.set_int64(CUDNN_ATTR_TENSOR_STRIDES, strides);
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  if (is_virtual) t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  t.finalize();
  return {t.get(), uid};
}

TensorRef GraphBuilder::tensor(int64_t uid, std::vector<int64_t> dims, std::vector<int64_t> strides,
                               cudnnDataType_t type) {
  return make_tensor(uid, dims, strides, type, false, false);
}

TensorRef GraphBuilder::virtual_tensor(std::vector<int64_t> dims, std::vector<int64_t> strides,
                                       cudnnDataType_t type) {
  return make_tensor(next_virtual_uid_++, dims, strides, type, true, false);
}

TensorRef GraphBuilder::scalar(int64_t uid, cudnnDataType_t type) {
  return make_tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, type, false, true);
}

void GraphBuilder::pointwise(cudnnPointwiseMode_t mode, TensorRef x, TensorRef b, TensorRef y,
                             cudnnDataType_t precision, TensorRef t, int64_t axis) {
  Descriptor& pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
  if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  pw.finalize();
  Descriptor& op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get());
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x.desc);
  if (b.desc) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b.desc);
  if (t.desc) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t.desc);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y.desc);
  op.finalize();
  ops_.push_back(op.get());
}

void GraphBuilder::reduction(cudnnReduceTensorOp_t reduce, TensorRef x, TensorRef y) {
  Descriptor& r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce);
  r.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  r.finalize();
  Descriptor& op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x.desc);
  op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y.desc);
  op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r.get());
  op.finalize();
  ops_.push_back(op.get());
}

void GraphBuilder::matmul(TensorRef a, TensorRef b, TensorRef c) {
  Descriptor& m = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  m.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  m.finalize();
  Descriptor& op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a.desc);
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b.desc);
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c.desc);
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, m.get());
  op.finalize();
  ops_.push_back(op.get());
}

void GraphBuilder::reshape(TensorRef x, TensorRef y) {
  Descriptor& op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x.desc);
  op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y.desc);
  op.finalize();
  ops_.push_back(op.get());
}

std::unique_ptr<Plan> GraphBuilder::build() {
  Descriptor& graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops_.size()),
            ops_.data());
  graph.finalize();

  std::string why = "the heuristics offered no engine configuration";
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Descriptor& heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.get());
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    heur.finalize();
    int64_t count = 0;
    FSDP_CALL(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    if (count == 0) continue;
    std::vector<cudnnBackendDescriptor_t> configs;
    for (int64_t i = 0; i < count; ++i) configs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
    FSDP_CALL(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count,
                                       configs.data()));
    for (int64_t i = 0; i < count; ++i) {
      auto plan = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
      plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[size_t(i)]);
      // A configuration that does not fit this graph refuses to finalize: try the next.
      const cudnnStatus_t status = cudnnBackendFinalize(plan->get());
      if (status != CUDNN_STATUS_SUCCESS) {
        why = str_cat("no engine configuration finalized (last: ", cudnnGetErrorString(status), ")");
        continue;
      }
      auto result = std::make_unique<Plan>();
      int64_t returned = 0;
      FSDP_CALL(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &returned, &result->workspace_bytes));
      result->plan = std::move(plan);
      result->keep = std::move(keep_);
      return result;
    }
  }
  FSDP_THROW(CudaError, "cuDNN graph: ", why);
}

void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()),
           pointers.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  FSDP_CALL(cudnnBackendExecute(handle, plan.plan->get(), pack.get()));
}

}  // namespace fsdp::kernels::cuda::cudnn
