// A small builder over cuDNN's backend graph API (cudnn.h: cudnnBackendCreateDescriptor,
// cudnnBackendSetAttribute, cudnnBackendFinalize, ...): tensors, pointwise / reduction /
// matmul / reshape operations, and the execution plan of the finished graph. Host code.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::kernels::cuda::cudnn {

// Owns one backend descriptor.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return desc_; }
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const void* values);
  void set_int64(cudnnBackendAttributeName_t name, const std::vector<int64_t>& v);
  void set_desc(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t d);
  void finalize();

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
};

// A tensor of the graph: its descriptor and unique id (the key of its data pointer).
struct TensorRef {
  cudnnBackendDescriptor_t desc = nullptr;
  int64_t uid = 0;
};

// A finalized execution plan with everything it references kept alive.
struct Plan {
  std::vector<std::unique_ptr<Descriptor>> keep;  // tensors, operations, graph, configs
  std::unique_ptr<Descriptor> plan;
  int64_t workspace_bytes = 0;
};

// Builds one operation graph. Tensors are 4-D; virtual tensors are intermediates that never
// reach memory; by-value tensors are host scalars passed with the variant pack.
class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}

  TensorRef tensor(int64_t uid, std::vector<int64_t> dims, std::vector<int64_t> strides,
                   cudnnDataType_t type);
  TensorRef virtual_tensor(std::vector<int64_t> dims, std::vector<int64_t> strides,
                           cudnnDataType_t type);
  TensorRef scalar(int64_t uid, cudnnDataType_t type);  // by value, [1, 1, 1, 1]

  // y = mode(x [, b] [, t]) computed in `precision`; `axis` for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, TensorRef x, TensorRef b, TensorRef y,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT, TensorRef t = {},
                 int64_t axis = -1);
  void reduction(cudnnReduceTensorOp_t op, TensorRef x, TensorRef y);
  void matmul(TensorRef a, TensorRef b, TensorRef c);  // f32 accumulation
  void reshape(TensorRef x, TensorRef y);

  // Finalizes the graph and the first engine configuration the heuristics offer that
  // finalizes into a plan. Throws CudaError when none does (the message says why).
  std::unique_ptr<Plan> build();

 private:
  Descriptor& make(cudnnBackendDescriptorType_t type);
  TensorRef make_tensor(int64_t uid, const std::vector<int64_t>& dims,
                        const std::vector<int64_t>& strides, cudnnDataType_t type, bool is_virtual,
                        bool by_value);
  cudnnHandle_t handle_;
  std::vector<std::unique_ptr<Descriptor>> keep_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_uid_ = 1 << 20;  // far above the caller's real tensor ids
};

// Runs `plan` on the current stream of `handle` with (uid, pointer) pairs and a workspace of
// at least plan.workspace_bytes.
void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace);

}  // namespace fsdp::kernels::cuda::cudnn
