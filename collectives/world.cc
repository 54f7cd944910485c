#include "collectives/world.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>

#include "collectives/check.h"
#include "collectives/mpi_communicator.h"
#include "collectives/progress_board.h"
#include "collectives/rendezvous.h"
#include "collectives/staged_communicator.h"
#include "runtime/core/log.h"

#if FSDP_WITH_CUDA
#include "collectives/nccl_communicator.h"
#include "runtime/core/cuda_check.h"
#endif

namespace fsdp {

#if FSDP_WITH_CUDA
namespace {
constexpr size_t kNcclIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
}  // namespace
#endif

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::Auto: return "auto";
    case Backend::Nccl: return "nccl";
    case Backend::Mpi: return "mpi";
    case Backend::Staged: return "staged";
  }
  return "?";
}

Backend backend_from_name(const std::string& name, const char* key) {
  for (Backend b : {Backend::Auto, Backend::Nccl, Backend::Mpi, Backend::Staged}) {
    if (name == backend_name(b)) return b;
  }
  FSDP_THROW(ConfigError, "unknown ", key, " '", name, "' (auto | nccl | mpi | staged)");
}

World::World(const WorldOptions& options) : World(parse_launch_env(process_environment()), options) {}

World::World(const LaunchInfo& launch, const WorldOptions& options)
    : launch_(options.alone ? launch_alone(launch) : launch),
      options_(options),
      uncaught_at_start_(std::uncaught_exceptions()) {
  FSDP_CHECK(options.timeout.count() > 0, ConfigError, "collective timeout must be positive, got ",
             options.timeout.count(), " ms");
  health_ = std::make_shared<CommHealth>(options.timeout, options.on_failure);
  backend_ = options.backend;
  if (backend_ == Backend::Auto) backend_ = cuda_device_count() > 0 ? Backend::Nccl : Backend::Mpi;

  // NCCL reads NCCL_COMM_ID itself: a world alone would bootstrap at the job's address.
  FSDP_CHECK(!(options.alone && backend_ == Backend::Nccl && !launch_.nccl_comm_id.empty()),
             LaunchError, "a world of this process alone cannot use NCCL with NCCL_COMM_ID set (",
             launch_.nccl_comm_id, "): NCCL would join the job's bootstrap; unset it");
  if (launch_.mpi || backend_ != Backend::Nccl) init_mpi();
  if (backend_ == Backend::Mpi) {
    device_ = Device::cpu();
    const MPI_Comm comm = options.alone ? MPI_COMM_SELF : MPI_COMM_WORLD;
    board_ = ProgressBoard::create(comm);
    world_ = MpiCommunicator::duplicate(comm, "world", health_, board_);
  } else if (backend_ == Backend::Staged) {
    create_staged_world();
  } else {
    create_nccl_world();
  }
  if (options.print_summary) Logger(rank()).info(summary());
}

void World::init_mpi() {
  int initialized = 0;
  FSDP_CALL(MPI_Initialized(&initialized));
  if (!initialized) {
    FSDP_CHECK(launch_.mpi || launch_.size == 1, LaunchError, "the ", backend_name(backend_),
               " backend needs an MPI launch (mpirun, or srun with an MPI plugin), but this ",
               "process was launched by ", launcher_name(launch_.launcher), " as rank ",
               launch_.rank, " of ", launch_.size, "; use the NCCL backend (one GPU per rank) ",
               "or launch with mpirun");
    // The staged backend's workers call MPI from their own threads.
    const int wanted = backend_ == Backend::Staged ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
    int provided = 0;
    FSDP_CALL(MPI_Init_thread(nullptr, nullptr, wanted, &provided));
    mpi_initialized_here_ = true;
  }
  if (backend_ == Backend::Staged) {
    int level = 0;
    FSDP_CALL(MPI_Query_thread(&level));
    FSDP_CHECK(level == MPI_THREAD_MULTIPLE, LaunchError, "the staged backend needs MPI ",
               "initialized with MPI_THREAD_MULTIPLE (its worker threads call MPI), but ",
               mpi_initialized_here_ ? "this MPI library provides only level "
                                     : "the program initialized MPI with level ",
               level, "; initialize MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)");
  }
  if (options_.alone) return;  // MPI_COMM_WORLD's numbers are the launch's, not this world's
  int mpi_rank = 0, mpi_size = 1;
  FSDP_CALL(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank));
  FSDP_CALL(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size));
  if (launch_.launcher == Launcher::Single) {
    // Started by an MPI we do not recognize (or as a singleton): MPI knows the numbers.
    launch_.rank = mpi_rank;
    launch_.size = mpi_size;
    launch_.mpi = true;
    MPI_Comm node = MPI_COMM_NULL;
    FSDP_CALL(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, mpi_rank, MPI_INFO_NULL,
                                  &node));
    FSDP_CALL(MPI_Comm_rank(node, &launch_.local_rank));
    FSDP_CALL(MPI_Comm_size(node, &launch_.local_size));
    FSDP_CALL(MPI_Comm_free(&node));
    return;
  }
  FSDP_CHECK(mpi_rank == launch_.rank && mpi_size == launch_.size, LaunchError, "the ",
             launcher_name(launch_.launcher), " launcher's variables say rank ", launch_.rank,
             " of ", launch_.size, ", but MPI_COMM_WORLD says rank ", mpi_rank, " of ", mpi_size);
}

void World::create_staged_world() {
  const MPI_Comm comm = options_.alone ? MPI_COMM_SELF : MPI_COMM_WORLD;
  // On a machine without a GPU the staged backend moves host buffers (tests run it so).
  if (cuda_device_count() > 0) {
    place_on_gpu();
  } else {
    device_ = Device::cpu();
  }
  board_ = ProgressBoard::create(comm);
  world_ = std::make_unique<StagedCommunicator>(
      MpiCommunicator::duplicate(comm, "world", health_, board_), device_);
}

#if FSDP_WITH_CUDA

namespace {

// Where a rank's GPU is: its host and the GPU's UUID, compared between ranks.
struct GpuIdentity {
  char host[64];
  unsigned char uuid[16];
};

GpuIdentity gpu_identity(int device) {
  GpuIdentity id;
  std::memset(&id, 0, sizeof(id));
  gethostname(id.host, sizeof(id.host) - 1);
  cudaDeviceProp prop;
  FSDP_CALL(cudaGetDeviceProperties(&prop, device));
  static_assert(sizeof(prop.uuid.bytes) == sizeof(id.uuid), "a CUDA UUID has 16 bytes");
  std::memcpy(id.uuid, prop.uuid.bytes, sizeof(id.uuid));
  return id;
}

bool same_gpu(const GpuIdentity& a, const GpuIdentity& b) {
  return std::strncmp(a.host, b.host, sizeof(a.host)) == 0 &&
         std::memcmp(a.uuid, b.uuid, sizeof(a.uuid)) == 0;
}

}  // namespace

void World::place_on_gpu() {
  const int visible = cuda_device_count();
  const int index = cuda_device_for_local_rank(launch_.local_rank, visible);
  device_ = Device::cuda(index);
  const bool nccl = backend_ == Backend::Nccl;
  const std::string advice = "NCCL needs one GPU per rank; set dist.backend=staged to let ranks "
                             "share GPUs (WorldOptions::backend = Backend::Staged), or launch "
                             "one rank per GPU";
  if (launch_.mpi && !options_.alone && launch_.size > 1) {
    // Exact: every rank says which GPU of which host it uses.
    const GpuIdentity mine = gpu_identity(index);
    std::vector<GpuIdentity> all(size_t(launch_.size));
    FSDP_CALL(MPI_Allgather(&mine, int(sizeof(mine)), MPI_BYTE, all.data(), int(sizeof(mine)),
                            MPI_BYTE, MPI_COMM_WORLD));
    ranks_on_device_ = 0;
    for (const GpuIdentity& other : all) ranks_on_device_ += same_gpu(mine, other) ? 1 : 0;
    if (!nccl) return;
    for (int a = 0; a < launch_.size; ++a) {
      for (int b = a + 1; b < launch_.size; ++b) {
        FSDP_CHECK(!same_gpu(all[size_t(a)], all[size_t(b)]), LaunchError, "ranks ", a, " and ",
                   b, " are on the same GPU of ", all[size_t(a)].host, ": ", advice);
      }
    }
    return;
  }
  // Without MPI the ranks cannot compare GPUs before NCCL starts; when each sees the same
  // devices, local ranks i and i + visible share one. (A launcher that gives each rank its
  // own CUDA_VISIBLE_DEVICES shows one device to each: nothing is known then.)
  if (options_.alone) return;
  ranks_on_device_ = 0;
  for (int r = 0; r < launch_.local_size; ++r) ranks_on_device_ += r % visible == index ? 1 : 0;
  FSDP_CHECK(!(nccl && visible > 1 && launch_.local_size > visible), LaunchError, "local ranks ",
             index, " and ", index + visible, " are on GPU ", physical_gpu(launch_, index), ": ",
             advice);
  if (visible == 1) ranks_on_device_ = 1;
}

void World::create_nccl_world() {
  place_on_gpu();
  nccl_ = std::make_shared<NcclShared>(health_, device_, options_.watchdog_poll);

  // Rank 0 makes the unique id; the others get it from MPI or a rendezvous. With
  // NCCL_COMM_ID set, NCCL derives the id from that address on every rank by itself.
  const bool self_made = !launch_.nccl_comm_id.empty() || launch_.size == 1;
  std::string id;
  if (self_made || launch_.rank == 0) id = NcclCommunicator::make_unique_id();
  bool used_file = false;
  if (!self_made) {
    if (launch_.mpi) {
      id.resize(kNcclIdBytes);
      MPI_Comm comm = MPI_COMM_NULL;
      FSDP_CALL(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
      FSDP_CALL(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
      FSDP_CALL(MPI_Bcast(&id[0], int(id.size()), MPI_BYTE, 0, comm));
      FSDP_CALL(MPI_Comm_free(&comm));
    } else if (!launch_.master_addr.empty()) {
      id = tcp_rendezvous(launch_.master_addr, launch_.master_port, launch_.rank, launch_.size,
                          id, options_.rendezvous_timeout);
    } else if (!launch_.rendezvous_file.empty()) {
      id = file_rendezvous(launch_.rendezvous_file, launch_.rank, launch_.size, id,
                           options_.rendezvous_timeout);
      used_file = true;
    } else {
      FSDP_THROW(LaunchError, "rank ", launch_.rank, " of ", launch_.size, " was launched by ",
                 launcher_name(launch_.launcher), " without MPI and without a rendezvous: ",
                 "set MASTER_ADDR and MASTER_PORT (or NCCL_COMM_ID, or FSDP_RENDEZVOUS_FILE)");
    }
  }
  world_ = NcclCommunicator::create(id, launch_.rank, launch_.size, "world", nccl_);
  // Every rank has read the file once they all joined the communicator.
  if (used_file && launch_.rank == 0) remove_rendezvous_file(launch_.rendezvous_file);
}

std::unique_ptr<Communicator> World::split(const std::string& name, int color, int key) {
  if (backend_ == Backend::Nccl) {
    return static_cast<NcclCommunicator&>(*world_).split(name, color, key);
  }
  if (backend_ == Backend::Staged) {
    return static_cast<StagedCommunicator&>(*world_).split(name, color, key);
  }
  return static_cast<MpiCommunicator&>(*world_).split(name, color, key);
}

#else  // CPU-only build

void World::place_on_gpu() {
  FSDP_THROW(DeviceError, "this build has no CUDA support (--config=cpu)");
}

void World::create_nccl_world() {
  FSDP_THROW(DeviceError, "the NCCL backend was requested, but this build has no CUDA support ",
             "(--config=cpu); use the MPI backend");
}

std::unique_ptr<Communicator> World::split(const std::string& name, int color, int key) {
  if (backend_ == Backend::Staged) {
    return static_cast<StagedCommunicator&>(*world_).split(name, color, key);
  }
  return static_cast<MpiCommunicator&>(*world_).split(name, color, key);
}

#endif

World::~World() {
  // Communicators first (the world one), then the NCCL state and its watchdog thread.
  world_.reset();
  nccl_.reset();
  board_.reset();
  const bool failed = std::uncaught_exceptions() > uncaught_at_start_ || health_->failed();
  if (!mpi_initialized_here_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (failed) {
    // MPI_Finalize waits for every rank; after a failure some never come. Leaving MPI
    // unfinalized makes mpirun end the whole job with an error instead.
    std::fprintf(stderr, "[rank %d] world: not finalizing MPI after a failure; the launcher "
                 "will end the other ranks\n", launch_.rank);
    return;
  }
  MPI_Finalize();
}

void World::abort(const std::string& reason) {
  health_->record_failure(FailureKind::Aborted, str_cat("rank ", rank(), " aborted: ", reason));
  world_->abort(reason);
}

std::string World::summary() const {
  std::string where = device_.str();
  if (device_.is_cuda() && launch_.cuda_visible_devices_set) {
    where += str_cat(" (GPU ", physical_gpu(launch_, device_.index), ")");
  }
  if (device_.is_cuda() && ranks_on_device_ > 1) {
    where += str_cat(", shared by ", ranks_on_device_, " ranks");
  }
  return str_cat("world: ", size(), size() == 1 ? " rank (" : " ranks (",
                 launcher_name(launch_.launcher), "), ", local_size(), " per node, rank ",
                 rank(), " -> ", where, ", backend ", backend_name(backend_), ", timeout ",
                 std::chrono::duration<double>(options_.timeout).count(), " s");
}

}  // namespace fsdp
