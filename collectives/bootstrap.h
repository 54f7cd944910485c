// Bootstrap: who launched this process, as which rank of how many, and which GPU it uses.
//
// parse_launch_env() is a pure function from environment variables to a LaunchInfo, so
// every launcher's conventions are unit-tested without launching anything. Launchers are
// recognized in this order (the first whose variables are present wins, because launchers
// nest: mpirun inside a Slurm allocation also sees SLURM_*, torchrun under srun too):
//   1. Open MPI:   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   2. MPICH/PMI:  PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS (Hydra, Intel MPI)
//   3. torchrun:   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (+ MASTER_ADDR/PORT)
//   4. Slurm srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID and
//                  SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE)
//   5. otherwise a single process.
// Inconsistent values (a rank outside the world, a local size larger than the world, a
// rank given without its size, text where a number belongs) raise LaunchError naming the
// variables and their values.
#pragma once

#include <map>
#include <string>

namespace fsdp {

enum class Launcher { Single, OpenMpi, Mpich, Torchrun, Slurm };
const char* launcher_name(Launcher launcher);  // "single", "openmpi", "mpich", "torchrun", "slurm"

using Environment = std::map<std::string, std::string>;

struct LaunchInfo {
  Launcher launcher = Launcher::Single;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  // Whether the processes were started by an MPI launcher, so MPI_Init works and MPI can
  // share the NCCL id (Open MPI, MPICH, and srun with an MPI plugin: PMI_RANK/PMIX_RANK).
  bool mpi = false;
  // Rendezvous for launches without MPI (torchrun style), each empty/0 when not given.
  std::string master_addr;      // MASTER_ADDR
  int master_port = 0;          // MASTER_PORT
  std::string nccl_comm_id;     // NCCL_COMM_ID ("host:port"): NCCL's own bootstrap
  std::string rendezvous_file;  // FSDP_RENDEZVOUS_FILE: last resort, a shared file
  std::string cuda_visible_devices;  // CUDA_VISIBLE_DEVICES as given (may be unset: "")
  bool cuda_visible_devices_set = false;
};

// The launch described by `env`. Throws LaunchError on inconsistent values.
LaunchInfo parse_launch_env(const Environment& env);

// This process's environment.
Environment process_environment();

// `launch` as a world of this process alone: rank 0 of 1, one rank per node. The local rank
// still picks the GPU, so processes of one launch that each run alone use different GPUs.
LaunchInfo launch_alone(const LaunchInfo& launch);

// The CUDA device (an index among the visible ones) for a local rank: local rank modulo
// the number of visible devices, so N ranks per node use N GPUs, and launchers that give
// each rank its own CUDA_VISIBLE_DEVICES (one device visible) still work.
int cuda_device_for_local_rank(int local_rank, int visible_devices);

// The physical GPU behind visible index `index` given CUDA_VISIBLE_DEVICES, for messages:
// ("2,3", 1) -> "3"; unset -> the index itself.
std::string physical_gpu(const LaunchInfo& launch, int index);

}  // namespace fsdp
