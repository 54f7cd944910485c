#include "collectives/progress_board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <random>

#include "runtime/core/error.h"

namespace fsdp {

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the board's entries are read by other processes: they must be lock-free");

namespace {

// Every MPI call of the set-up goes through here: on any failure the board is simply not
// made (after the node's ranks agree on that, so none waits for the others).
bool ok(int status) { return status == MPI_SUCCESS; }

}  // namespace

std::shared_ptr<ProgressBoard> ProgressBoard::create(MPI_Comm world) {
  int world_rank = 0;
  MPI_Comm node = MPI_COMM_NULL;
  if (!ok(MPI_Comm_rank(world, &world_rank)) ||
      !ok(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node))) {
    return nullptr;
  }
  MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
  std::shared_ptr<ProgressBoard> board(new ProgressBoard());
  int node_rank = 0, node_size = 1;
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_size(node, &node_size);
  board->node_world_ranks_.resize(size_t(node_size));
  bool made = ok(MPI_Allgather(&world_rank, 1, MPI_INT, board->node_world_ranks_.data(), 1,
                               MPI_INT, node));
  // The node's first rank creates the segment under a fresh name and tells the others.
  const size_t row_bytes = sizeof(Entry) * kEntries;
  board->mapped_bytes_ = row_bytes * size_t(node_size);
  char name[64] = {0};
  int fd = -1;
  if (made && node_rank == 0) {
    std::random_device random;
    std::snprintf(name, sizeof(name), "/fsdp-board-%d-%08x", int(getpid()), unsigned(random()));
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 && ftruncate(fd, off_t(board->mapped_bytes_)) != 0) {
      close(fd);
      shm_unlink(name);
      fd = -1;
    }
    if (fd < 0) name[0] = '\0';
  }
  made = made && ok(MPI_Bcast(name, int(sizeof(name)), MPI_CHAR, 0, node)) && name[0] != '\0';
  if (made && node_rank != 0) fd = shm_open(name, O_RDWR, 0600);
  if (made && fd >= 0) {
    void* p = mmap(nullptr, board->mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) board->mapped_ = p;
  }
  if (fd >= 0) close(fd);
  // Every rank has mapped the segment (or failed to) before its name goes away.
  int mapped = board->mapped_ ? 1 : 0, all_mapped = 0;
  made = ok(MPI_Allreduce(&mapped, &all_mapped, 1, MPI_INT, MPI_MIN, node)) && all_mapped == 1;
  if (node_rank == 0 && name[0] != '\0') shm_unlink(name);
  MPI_Comm_free(&node);
  if (!made) return nullptr;  // the destructor unmaps what was mapped

  unsigned char* base = static_cast<unsigned char*>(board->mapped_);
  board->mine_ = reinterpret_cast<Entry*>(base + row_bytes * size_t(node_rank));
  for (int i = 0; i < kEntries; ++i) {
    new (&board->mine_[i].key) std::atomic<uint64_t>(0);
    new (&board->mine_[i].count) std::atomic<uint64_t>(0);
  }
  board->rows_.resize(size_t(node_size));
  for (int r = 0; r < node_size; ++r) {
    board->rows_[size_t(r)] = reinterpret_cast<const Entry*>(base + row_bytes * size_t(r));
  }
  return board;
}

ProgressBoard::~ProgressBoard() {
  if (mapped_) munmap(mapped_, mapped_bytes_);
}

uint64_t ProgressBoard::key_of(const std::string& name, const std::vector<int>& members) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](uint64_t byte) {
    h ^= byte;
    h *= 1099511628211ull;
  };
  for (char c : name) mix(uint8_t(c));
  mix(0xff);
  for (int m : members) {
    for (int i = 0; i < 4; ++i) mix((uint32_t(m) >> (8 * i)) & 0xffu);
  }
  return h == 0 ? 1 : h;  // 0 marks an unused entry
}

int ProgressBoard::claim(uint64_t key) {
  if (used_ >= kEntries) return -1;
  const int entry = used_++;
  mine_[entry].count.store(0, std::memory_order_relaxed);
  mine_[entry].key.store(key, std::memory_order_release);
  return entry;
}

void ProgressBoard::started(int entry, uint64_t count) {
  if (entry < 0 || entry >= kEntries) return;
  mine_[entry].count.store(count, std::memory_order_release);
}

const ProgressBoard::Entry* ProgressBoard::row_of(int world_rank) const {
  for (size_t i = 0; i < node_world_ranks_.size(); ++i) {
    if (node_world_ranks_[i] == world_rank) return rows_[i];
  }
  return nullptr;
}

std::string ProgressBoard::laggards(uint64_t key, uint64_t count,
                                    const std::vector<int>& members) const {
  std::string behind, unseen;
  for (int member : members) {
    const Entry* row = row_of(member);
    if (!row) {
      unseen += str_cat(unseen.empty() ? "" : ", ", member);
      continue;
    }
    uint64_t started = 0;
    for (int i = 0; i < kEntries; ++i) {
      if (row[i].key.load(std::memory_order_acquire) != key) continue;
      started = row[i].count.load(std::memory_order_acquire);
      break;
    }
    if (started >= count) continue;
    behind += str_cat(behind.empty() ? "" : "; ", "rank ", member,
                      " has not reached it (it started ", started, " operation",
                      started == 1 ? "" : "s", " on this group; this is operation ", count, ")");
  }
  std::string out = behind;
  if (!unseen.empty()) {
    out += str_cat(out.empty() ? "" : "; ", "rank(s) ", unseen,
                   " are on other nodes, where this rank cannot see how far they got");
  }
  return out;
}

}  // namespace fsdp
