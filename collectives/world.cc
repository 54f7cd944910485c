#include "collectives/world.h"

#include <mpi.h>

#include <cstdio>
#include <exception>

#include "collectives/check.h"
#include "collectives/mpi_communicator.h"
#include "collectives/rendezvous.h"
#include "runtime/core/log.h"

#if FSDP_WITH_CUDA
#include "collectives/nccl_communicator.h"
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
  }
  return "?";
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
  if (launch_.mpi || backend_ == Backend::Mpi) init_mpi();
  if (backend_ == Backend::Mpi) {
    device_ = Device::cpu();
    world_ = MpiCommunicator::duplicate(options.alone ? MPI_COMM_SELF : MPI_COMM_WORLD, "world",
                                        health_);
  } else {
    create_nccl_world();
  }
  if (options.print_summary) Logger(rank()).info(summary());
}

void World::init_mpi() {
  int initialized = 0;
  FSDP_CALL(MPI_Initialized(&initialized));
  if (!initialized) {
    FSDP_CHECK(launch_.mpi || launch_.size == 1, LaunchError, "the MPI backend needs an MPI ",
               "launch (mpirun, or srun with an MPI plugin), but this process was launched by ",
               launcher_name(launch_.launcher), " as rank ", launch_.rank, " of ", launch_.size,
               "; use a GPU (NCCL) build or launch with mpirun");
    int provided = 0;
    FSDP_CALL(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
    mpi_initialized_here_ = true;
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

#if FSDP_WITH_CUDA

void World::create_nccl_world() {
  device_ = Device::cuda(cuda_device_for_local_rank(launch_.local_rank, cuda_device_count()));
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
  return static_cast<MpiCommunicator&>(*world_).split(name, color, key);
}

#else  // CPU-only build

void World::create_nccl_world() {
  FSDP_THROW(DeviceError, "the NCCL backend was requested, but this build has no CUDA support ",
             "(--config=cpu); use the MPI backend");
}

std::unique_ptr<Communicator> World::split(const std::string& name, int color, int key) {
  return static_cast<MpiCommunicator&>(*world_).split(name, color, key);
}

#endif

World::~World() {
  // Communicators first (the world one), then the NCCL state and its watchdog thread.
  world_.reset();
  nccl_.reset();
  if (!mpi_initialized_here_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (std::uncaught_exceptions() > uncaught_at_start_ || health_->failed()) {
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
  return str_cat("world: ", size(), size() == 1 ? " rank (" : " ranks (",
                 launcher_name(launch_.launcher), "), ", local_size(), " per node, rank ",
                 rank(), " -> ", where, ", backend ", backend_name(backend_), ", timeout ",
                 std::chrono::duration<double>(options_.timeout).count(), " s");
}

}  // namespace fsdp
