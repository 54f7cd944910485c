// Rendezvous without MPI: rank 0 hands a small payload (the NCCL unique id) to every other
// rank of a job launched torchrun-style.
//
// - TCP (MASTER_ADDR:MASTER_PORT): rank 0 listens on the port; the others connect,
//   retrying until the timeout, say who they are (rank, world size) and receive the
//   payload. A rank of another job (different size) or a repeated rank is an error.
// - File (FSDP_RENDEZVOUS_FILE), the last resort on a shared filesystem: rank 0 writes the
//   payload atomically (write + rename); the others poll for it. Files older than the
//   timeout when a rank starts waiting are taken to be left over from an earlier job and
//   ignored. Rank 0 removes the file once everyone has it (remove_rendezvous_file).
//
// Both return the payload on every rank and raise TimeoutError naming the address or file
// when the other side does not show up in time.
#pragma once

#include <chrono>
#include <string>

namespace fsdp {

std::string tcp_rendezvous(const std::string& host, int port, int rank, int size,
                           const std::string& payload, std::chrono::milliseconds timeout);

std::string file_rendezvous(const std::string& path, int rank, int size,
                            const std::string& payload, std::chrono::milliseconds timeout);

void remove_rendezvous_file(const std::string& path);

}  // namespace fsdp
