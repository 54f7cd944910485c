// check_call() overload for MPI's int return codes, so that every MPI call goes through
// FSDP_CALL (runtime/core/error.h). NCCL's is in nccl_check.h.
//
// MPI calls only report errors as return codes on communicators whose error handler is
// MPI_ERRORS_RETURN; every communicator made here sets it (see MpiCommunicator).
#pragma once

#include <mpi.h>

#include <string>

#include "runtime/core/error.h"

namespace fsdp {

inline void check_call(int mpi_status, const char* expr, const char* file, int line) {
  if (mpi_status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(mpi_status, text, &length) != MPI_SUCCESS) text[0] = '\0';
  throw CommError(str_cat(expr, " failed: MPI error ", mpi_status, " (", text, ") at ", file, ":",
                          line));
}

}  // namespace fsdp
