// What `train --version` prints: the git revision and the versions of the libraries this
// binary runs with (CUDA runtime and driver, cuDNN, cuBLAS, NCCL, MPI).
#pragma once

#include <string>

namespace fsdp::train {

std::string version_report(const std::string& git_revision);

}  // namespace fsdp::train
