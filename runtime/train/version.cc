#include "runtime/train/version.h"

#include <mpi.h>

#include "runtime/core/error.h"

#if FSDP_WITH_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>
#endif

namespace fsdp::train {

#if FSDP_WITH_CUDA
namespace {

// "12.9" from CUDA's integer versions (major*1000 + minor*10).
std::string cuda_version(int v) { return str_cat(v / 1000, ".", (v % 1000) / 10); }

}  // namespace
#endif

std::string version_report(const std::string& git_revision) {
  std::string out = str_cat("fsdp.cpp ", git_revision, "\n");
#if FSDP_WITH_CUDA
  int rt = 0, drv = 0;
  // Version queries only: a machine without a driver reports 0 rather than failing.
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  out += str_cat("CUDA runtime ", cuda_version(rt), ", driver ",
                 drv ? cuda_version(drv) : std::string("none"), "\n");
  const size_t cudnn = cudnnGetVersion();
  out += str_cat("cuDNN ", cudnn / 10000, ".", (cudnn % 10000) / 100, ".", cudnn % 100, "\n");
  const size_t lt = cublasLtGetVersion();
  out += str_cat("cuBLASLt ", lt / 10000, ".", (lt % 10000) / 100, ".", lt % 100, "\n");
  int nccl = 0;
  ncclGetVersion(&nccl);
  out += str_cat("NCCL ", nccl / 10000, ".", (nccl % 10000) / 100, ".", nccl % 100, "\n");
#else
  out += "CUDA: not built (CPU-only configuration)\n";
#endif
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string m(mpi, size_t(len));
  if (const size_t end = m.find_first_of(std::string("\n\0", 2)); end != std::string::npos) m.resize(end);
  while (!m.empty() && (m.back() == ',' || m.back() == ' ')) m.pop_back();
  out += m + "\n";
  return out;
}

}  // namespace fsdp::train
