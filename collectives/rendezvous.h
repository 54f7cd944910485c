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
#include <cstddef>
#include <optional>
#include <string>

namespace fsdp {

std::string tcp_rendezvous(const std::string& host, int port, int rank, int size,
                           const std::string& payload, std::chrono::milliseconds timeout);

std::string file_rendezvous(const std::string& path, int rank, int size,
                            const std::string& payload, std::chrono::milliseconds timeout);

void remove_rendezvous_file(const std::string& path);

// The payload is small (an NCCL unique id is 128 bytes); anything longer is not ours.
constexpr size_t kMaxRendezvousPayload = size_t(1) << 16;

// A rendezvous file as rank 0 writes it: the line "FSDP-RENDEZVOUS 1 <ranks> <bytes>", then
// the payload's bytes.
struct RendezvousRecord {
  int size = 0;  // ranks of the job that wrote it
  std::string payload;
};
std::string format_rendezvous_record(const RendezvousRecord& record);
// The record in `contents`, or nullopt while it is not one or not complete (a reader polls
// again): a header other than format_rendezvous_record's (byte for byte), a payload length
// over kMaxRendezvousPayload, or other than the bytes that follow the header.
std::optional<RendezvousRecord> parse_rendezvous_record(const std::string& contents);

}  // namespace fsdp
