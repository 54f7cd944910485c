// ProgressBoard: how many operations each rank of a node has started on each communicator,
// in memory the node's ranks share (a POSIX shared-memory segment, unlinked as soon as every
// rank has mapped it, so nothing outlives the job), so that a rank whose
// collective times out can name the ranks that never reached it:
//   "... did not finish within 12 s: rank 1 has not reached it (it started 41 operations on
//    this group; this is operation 42)"
//
// Each rank writes only its own row: one entry per communicator it belongs to (a key equal
// on every member: a hash of the group's name and its members' world ranks, and the number
// of operations started). Any rank reads every row of its node. Ranks on other nodes are not
// visible, and are said to be so. Used by the MPI backend, whose operations the staged
// backend also runs.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

class ProgressBoard {
 public:
  // Collective over `world`: the ranks of each node share one segment. Returns nullptr
  // where it cannot be made (the board only improves messages; nothing depends on it).
  // Destroying a board is local (no collective), so a failed rank can drop it at any time.
  static std::shared_ptr<ProgressBoard> create(MPI_Comm world);
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  // The key of a group: its name and its members' world ranks, in group order.
  static uint64_t key_of(const std::string& name, const std::vector<int>& members);

  // This rank's entry for the group `key` (index into its row), or -1 when the row is full.
  int claim(uint64_t key);
  // This rank has started `count` operations on the group of `entry`.
  void started(int entry, uint64_t count);

  // The members (world ranks) of group `key` on this node that have started fewer than
  // `count` operations on it, in words, and the members that cannot be seen. "" when every
  // visible member has started the operation.
  std::string laggards(uint64_t key, uint64_t count, const std::vector<int>& members) const;

 private:
  struct Entry {
    std::atomic<uint64_t> key;
    std::atomic<uint64_t> count;
  };
  static constexpr int kEntries = 64;

  ProgressBoard() = default;
  const Entry* row_of(int world_rank) const;

  void* mapped_ = nullptr;
  size_t mapped_bytes_ = 0;
  Entry* mine_ = nullptr;
  int used_ = 0;
  std::vector<int> node_world_ranks_;   // world rank of each node-local rank
  std::vector<const Entry*> rows_;      // each node-local rank's row
};

}  // namespace fsdp
