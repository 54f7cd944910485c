// World: this process's place in the job, and the communicator over all ranks.
//
// Constructing a World reads the launcher's environment (bootstrap.h), picks the backend
// (NCCL when a GPU is usable, MPI otherwise, unless the options say), initializes MPI when
// the job was launched by MPI or uses the MPI backend (unless the host program already
// did), picks the GPU from the local rank, creates the world communicator (sharing the
// NCCL unique id by MPI_Bcast, or by a TCP or file rendezvous for launches without MPI),
// starts the NCCL watchdog, and prints a one-line topology summary on rank 0:
//   world: 2 ranks (openmpi), 2 per node, rank 0 -> cuda:0, backend nccl, timeout 600 s
//
// Every communicator made from a World (split(), build_mesh_communicators()) must be
// destroyed before it. The destructor finalizes MPI only if this World initialized it and
// the job did not fail: after a failure (a collective timed out, an exception is
// unwinding) MPI is left unfinalized, so that mpirun ends the other ranks instead of
// waiting for them in MPI_Finalize.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "collectives/bootstrap.h"
#include "collectives/communicator.h"
#include "collectives/health.h"
#include "runtime/core/device.h"

namespace fsdp {

class NcclShared;     // collectives/nccl_communicator.h (CUDA builds only)
class ProgressBoard;  // collectives/progress_board.h

// Auto: NCCL where a GPU is visible, MPI otherwise. Staged: device buffers staged through
// pinned host memory and moved by MPI (collectives/staged_communicator.h), so several ranks
// may share a GPU; on a machine without one it runs on host buffers.
enum class Backend { Auto, Nccl, Mpi, Staged };
const char* backend_name(Backend backend);  // "auto", "nccl", "mpi", "staged"
// Accepts those names; throws ConfigError naming `key` and the value otherwise.
Backend backend_from_name(const std::string& name, const char* key);

struct WorldOptions {
  Backend backend = Backend::Auto;
  // A collective that has not finished after this long ends the job with a TimeoutError
  // (recipes: dist.distributed_timeout_minutes).
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // How long ranks wait for each other while starting up (TCP or file rendezvous).
  std::chrono::milliseconds rendezvous_timeout = std::chrono::minutes(5);
  // How often the NCCL watchdog looks at in-flight collectives.
  std::chrono::milliseconds watchdog_poll = std::chrono::milliseconds(100);
  bool print_summary = true;
  // Called once with the message of the job's first communication failure (a hung
  // collective, an asynchronous NCCL error, an abort), on the thread that noticed it: the
  // watchdog's, usually. The library itself never ends the process: it aborts the
  // communicators and raises the failure on the main thread. But after ncclCommAbort a
  // collective's kernel can keep spinning on a peer that is gone, and then any call that
  // waits for the device (a stream synchronize, cudaFree) never returns. An application
  // that must not hang then ends the process from here, after a grace period (tools/train
  // does).
  std::function<void(const std::string&)> on_failure;
  // A world of this process alone (rank 0 of 1, launch_alone()), whatever launched it: the
  // other processes of the launch take no part (MPI_COMM_SELF; NCCL with one rank). For a
  // run beside the job's own inside one program, e.g. a single-process reference run.
  bool alone = false;
};

class World {
 public:
  // The launch described by this process's environment.
  explicit World(const WorldOptions& options = WorldOptions());
  World(const LaunchInfo& launch, const WorldOptions& options);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return launch_.rank; }
  int size() const { return launch_.size; }
  int local_rank() const { return launch_.local_rank; }
  int local_size() const { return launch_.local_size; }
  const LaunchInfo& launch() const { return launch_; }
  Device device() const { return device_; }
  Backend backend() const { return backend_; }  // Nccl, Mpi or Staged, never Auto
  // The ranks of this node that use this rank's device, itself included (1 on the CPU):
  // with the staged backend several ranks may share one GPU.
  int ranks_on_device() const { return ranks_on_device_; }

  // The communicator over every rank (named "world").
  Communicator& comm() { return *world_; }
  // Ranks that pass the same `color` form a new communicator named `name`, ordered by
  // `key`. Collective: every rank of the world calls it, in the same order.
  std::unique_ptr<Communicator> split(const std::string& name, int color, int key);

  // The step being run, named in timeout messages of every communicator of this World.
  void set_step(int64_t step) { health_->set_step(step); }
  // Raises the job's recorded failure (e.g. the watchdog's TimeoutError), if any.
  void check_health() const { health_->raise_if_failed(); }
  const std::shared_ptr<CommHealth>& health() const { return health_; }
  // Records `reason` as the job's failure and aborts every communicator (NCCL).
  void abort(const std::string& reason);

  // "world: 2 ranks (openmpi), 2 per node, rank 0 -> cuda:0, backend nccl, timeout 600 s"
  std::string summary() const;

 private:
  void init_mpi();
  void create_nccl_world();
  void create_staged_world();
  // The GPU for this rank (round-robin over the visible ones), and how many ranks of the
  // node share it: exact under MPI (the ranks compare their GPUs' UUIDs), from the local
  // ranks otherwise. With NCCL, two ranks on one GPU are refused here, by name.
  void place_on_gpu();

  LaunchInfo launch_;
  WorldOptions options_;
  Backend backend_ = Backend::Mpi;
  Device device_;
  int ranks_on_device_ = 1;
  bool mpi_initialized_here_ = false;
  int uncaught_at_start_ = 0;
  std::shared_ptr<CommHealth> health_;
  std::shared_ptr<NcclShared> nccl_;
  std::shared_ptr<ProgressBoard> board_;  // MPI and staged backends
  std::unique_ptr<Communicator> world_;
};

}  // namespace fsdp
