// Launcher detection, GPU choice and the rendezvous used by launches without MPI.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "collectives/bootstrap.h"
#include "collectives/rendezvous.h"
#include "runtime/core/error.h"
#include "tests/test_support.h"

namespace fsdp {
namespace {

using Catch::Matchers::Contains;

// The LaunchError message for `env`, or "" if it parsed.
std::string launch_error(const Environment& env) {
  try {
    parse_launch_env(env);
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("no launcher variables: a single process") {
  const LaunchInfo info = parse_launch_env({{"HOME", "/"}});
  CHECK(info.launcher == Launcher::Single);
  CHECK(info.rank == 0);
  CHECK(info.size == 1);
  CHECK(info.local_rank == 0);
  CHECK(info.local_size == 1);
  CHECK_FALSE(info.mpi);
}

TEST_CASE("Open MPI variables") {
  const LaunchInfo info = parse_launch_env({{"OMPI_COMM_WORLD_RANK", "5"},
                                            {"OMPI_COMM_WORLD_SIZE", "8"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                            // mpirun inside a Slurm job: Open MPI wins
                                            {"SLURM_PROCID", "0"},
                                            {"SLURM_NTASKS", "2"}});
  CHECK(info.launcher == Launcher::OpenMpi);
  CHECK(info.rank == 5);
  CHECK(info.size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_size == 4);
  CHECK(info.mpi);
}

TEST_CASE("MPICH / PMI variables") {
  const LaunchInfo info = parse_launch_env({{"PMI_RANK", "3"},
                                            {"PMI_SIZE", "4"},
                                            {"MPI_LOCALRANKID", "1"},
                                            {"MPI_LOCALNRANKS", "2"}});
  CHECK(info.launcher == Launcher::Mpich);
  CHECK(info.rank == 3);
  CHECK(info.size == 4);
  CHECK(info.local_rank == 1);
  CHECK(info.local_size == 2);
  CHECK(info.mpi);
}

TEST_CASE("torchrun variables, with the rendezvous address") {
  const LaunchInfo info = parse_launch_env({{"RANK", "2"},
                                            {"WORLD_SIZE", "4"},
                                            {"LOCAL_RANK", "0"},
                                            {"LOCAL_WORLD_SIZE", "2"},
                                            {"MASTER_ADDR", "node7"},
                                            {"MASTER_PORT", "29500"},
                                            {"CUDA_VISIBLE_DEVICES", "2,3"}});
  CHECK(info.launcher == Launcher::Torchrun);
  CHECK(info.rank == 2);
  CHECK(info.size == 4);
  CHECK(info.local_rank == 0);
  CHECK(info.local_size == 2);
  CHECK_FALSE(info.mpi);
  CHECK(info.master_addr == "node7");
  CHECK(info.master_port == 29500);
  CHECK(info.cuda_visible_devices_set);
  CHECK(physical_gpu(info, 1) == "3");
}

TEST_CASE("env launch without local variables is one node") {
  const LaunchInfo info = parse_launch_env({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  CHECK(info.local_rank == 1);
  CHECK(info.local_size == 2);
}

TEST_CASE("Slurm variables, tasks per node from the step's list") {
  const LaunchInfo info = parse_launch_env({{"SLURM_PROCID", "4"},
                                            {"SLURM_NTASKS", "16"},
                                            {"SLURM_STEP_NUM_TASKS", "7"},
                                            {"SLURM_LOCALID", "1"},
                                            {"SLURM_NODEID", "1"},
                                            {"SLURM_STEP_TASKS_PER_NODE", "3,2(x2)"}});
  CHECK(info.launcher == Launcher::Slurm);
  CHECK(info.rank == 4);
  CHECK(info.size == 7);  // the step's tasks, not the allocation's
  CHECK(info.local_rank == 1);
  CHECK(info.local_size == 2);
  CHECK_FALSE(info.mpi);
  // srun with an MPI plugin
  CHECK(parse_launch_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                          {"PMIX_RANK", "0"}})
            .mpi);
}

TEST_CASE("inconsistent launcher variables are LaunchErrors naming them") {
  CHECK_THAT(launch_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
             Contains("RANK=4") && Contains("WORLD_SIZE=4"));
  CHECK_THAT(launch_error({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}), Contains("RANK=-1"));
  CHECK_THAT(launch_error({{"RANK", "1"}}), Contains("WORLD_SIZE") && Contains("RANK"));
  CHECK_THAT(launch_error({{"RANK", "one"}, {"WORLD_SIZE", "2"}}),
             Contains("RANK='one'") && Contains("not an integer"));
  CHECK_THAT(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), Contains("WORLD_SIZE=0"));
  CHECK_THAT(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"},
                           {"LOCAL_WORLD_SIZE", "2"}}),
             Contains("LOCAL_RANK=2") && Contains("LOCAL_WORLD_SIZE=2"));
  CHECK_THAT(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "3"}}),
             Contains("LOCAL_WORLD_SIZE=3"));
  CHECK_THAT(launch_error({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
             Contains("OMPI_COMM_WORLD_RANK=2"));
  CHECK_THAT(launch_error({{"OMPI_COMM_WORLD_SIZE", "2"}}), Contains("OMPI_COMM_WORLD_RANK"));
  CHECK_THAT(launch_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "5"},
                           {"MPI_LOCALNRANKS", "2"}}),
             Contains("MPI_LOCALRANKID=5"));
  CHECK_THAT(launch_error({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "2"}}),
             Contains("SLURM_PROCID=3") && Contains("SLURM_NTASKS=2"));
  CHECK_THAT(launch_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"},
                           {"SLURM_TASKS_PER_NODE", "2(3)"}}),
             Contains("SLURM_TASKS_PER_NODE='2(3)'"));
  CHECK_THAT(launch_error({{"MASTER_ADDR", "host"}}), Contains("MASTER_PORT"));
  CHECK_THAT(launch_error({{"MASTER_ADDR", "host"}, {"MASTER_PORT", "70000"}}),
             Contains("MASTER_PORT=70000"));
  CHECK_THAT(launch_error({{"NCCL_COMM_ID", "host"}}), Contains("NCCL_COMM_ID='host'"));
}

TEST_CASE("the GPU is the local rank modulo the visible devices") {
  CHECK(cuda_device_for_local_rank(0, 2) == 0);
  CHECK(cuda_device_for_local_rank(1, 2) == 1);
  CHECK(cuda_device_for_local_rank(3, 2) == 1);
  CHECK(cuda_device_for_local_rank(3, 1) == 0);  // each rank sees only its own GPU
  CHECK_THROWS_AS(cuda_device_for_local_rank(0, 0), DeviceError);
  LaunchInfo unset;
  CHECK(physical_gpu(unset, 1) == "1");
}

// A TCP port nobody listens on right now (the kernel picks it).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Runs ranks 1..size-1 of a rendezvous on threads (they start before rank 0 listens, so the
// retries are exercised) and rank 0 on this thread; returns what every rank received.
template <typename Rendezvous>
std::vector<std::string> run_ranks(int size, const std::string& payload, Rendezvous rendezvous) {
  std::vector<std::future<std::string>> others;
  for (int r = 1; r < size; ++r) {
    others.push_back(std::async(std::launch::async, [=] { return rendezvous(r, ""); }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<std::string> got{rendezvous(0, payload)};
  for (auto& f : others) got.push_back(f.get());
  return got;
}

TEST_CASE("TCP rendezvous hands rank 0's payload to every rank") {
  const int port = free_port();
  std::string payload(128, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = char(i * 7 + 1);  // binary, with zeros
  payload[5] = '\0';
  const auto got = run_ranks(4, payload, [&](int rank, const std::string& mine) {
    return tcp_rendezvous("localhost", port, rank, 4, mine, std::chrono::seconds(20));
  });
  for (const auto& g : got) CHECK(g == payload);
}

TEST_CASE("TCP rendezvous times out naming the address when rank 0 never comes") {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  try {
    tcp_rendezvous("127.0.0.1", port, 1, 2, "", std::chrono::milliseconds(800));
    FAIL("no TimeoutError");
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), Contains("MASTER_ADDR=127.0.0.1") &&
                             Contains(str_cat("MASTER_PORT=", port)));
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("TCP rendezvous rejects a rank of a job of another size") {
  const int port = free_port();
  auto root = std::async(std::launch::async, [&] {
    return tcp_rendezvous("localhost", port, 0, 2, "id", std::chrono::seconds(20));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK_THROWS_AS(tcp_rendezvous("localhost", port, 1, 3, "", std::chrono::seconds(20)),
                  LaunchError);
  CHECK_THROWS_AS(root.get(), LaunchError);
}

TEST_CASE("file rendezvous hands rank 0's payload to every rank and ignores stale files") {
  const std::string path =
      (std::filesystem::temp_directory_path() / str_cat("fsdp_rdv_", ::getpid())).string();
  const std::string payload = std::string("\x01\x00\x02 id", 6);
  const auto got = run_ranks(3, payload, [&](int rank, const std::string& mine) {
    return file_rendezvous(path, rank, 3, mine, std::chrono::seconds(20));
  });
  for (const auto& g : got) CHECK(g == payload);
  // The file is now "old" for a rank that allows it only a very short age.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  CHECK_THROWS_AS(file_rendezvous(path, 1, 3, "", std::chrono::milliseconds(500)), TimeoutError);
  // A file of another job size is an error, not a silent mix-up.
  file_rendezvous(path, 0, 2, payload, std::chrono::seconds(1));
  CHECK_THROWS_AS(file_rendezvous(path, 1, 3, "", std::chrono::seconds(5)), LaunchError);
  remove_rendezvous_file(path);
  CHECK_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace fsdp
