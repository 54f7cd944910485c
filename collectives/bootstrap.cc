#include "collectives/bootstrap.h"

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "runtime/core/error.h"

extern char** environ;

namespace fsdp {
namespace {

// The variables one launcher uses for the four numbers, for reading and for messages.
struct LauncherVars {
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

const std::string* find(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

bool has(const Environment& env, const char* name) { return find(env, name) != nullptr; }

int parse_int(const Environment& env, const char* name) {
  const std::string* text = find(env, name);
  FSDP_ASSERT(text != nullptr, name);
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text->c_str(), &end, 10);
  FSDP_CHECK(!text->empty() && end && *end == '\0' && errno == 0 && value >= INT32_MIN &&
                 value <= INT32_MAX,
             LaunchError, name, "='", *text, "' is not an integer");
  return int(value);
}

// Reads rank and size (both required once either is present) and the local pair (each
// optional: a launch without them is taken to be one node).
void read_numbers(const Environment& env, const LauncherVars& vars, LaunchInfo& info) {
  FSDP_CHECK(has(env, vars.rank) && has(env, vars.size), LaunchError, "launcher variables: ",
             vars.rank, " and ", vars.size, " must be set together, but only ",
             has(env, vars.rank) ? vars.rank : vars.size, " is set");
  info.rank = parse_int(env, vars.rank);
  info.size = parse_int(env, vars.size);
  info.local_rank = vars.local_rank && has(env, vars.local_rank) ? parse_int(env, vars.local_rank)
                                                                 : info.rank;
  info.local_size = vars.local_size && has(env, vars.local_size) ? parse_int(env, vars.local_size)
                                                                 : info.size;
}

void validate(const LaunchInfo& info, const LauncherVars& vars) {
  const std::string rank_var = vars.rank, size_var = vars.size;
  const std::string local_rank_var = vars.local_rank ? vars.local_rank : "the local rank";
  const std::string local_size_var = vars.local_size ? vars.local_size : "the local size";
  FSDP_CHECK(info.size >= 1, LaunchError, size_var, "=", info.size, " must be at least 1");
  FSDP_CHECK(info.rank >= 0 && info.rank < info.size, LaunchError, rank_var, "=", info.rank,
             " is not a rank of a world of ", size_var, "=", info.size, " (0 <= ", rank_var,
             " < ", size_var, ")");
  FSDP_CHECK(info.local_size >= 1 && info.local_size <= info.size, LaunchError, local_size_var,
             "=", info.local_size, " must be between 1 and ", size_var, "=", info.size);
  FSDP_CHECK(info.local_rank >= 0 && info.local_rank < info.local_size, LaunchError,
             local_rank_var, "=", info.local_rank, " is not a rank of a node of ",
             local_size_var, "=", info.local_size);
  FSDP_CHECK(info.local_rank <= info.rank, LaunchError, local_rank_var, "=", info.local_rank,
             " cannot exceed ", rank_var, "=", info.rank);
}

// Slurm's tasks-per-node lists: "4", "2(x3)", "2(x3),1" -> {2, 2, 2, 1}.
std::vector<int> parse_tasks_per_node(const std::string& name, const std::string& text) {
  std::vector<int> out;
  size_t pos = 0;
  auto fail = [&]() {
    FSDP_THROW(LaunchError, name, "='", text, "' is not a Slurm tasks-per-node list such as ",
               "'2(x3),1'");
  };
  while (pos < text.size()) {
    size_t end = pos;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end == pos) fail();
    const int tasks = std::atoi(text.substr(pos, end - pos).c_str());
    int repeat = 1;
    pos = end;
    if (pos < text.size() && text[pos] == '(') {
      if (text.compare(pos, 2, "(x") != 0) fail();
      size_t digits = pos + 2, close = digits;
      while (close < text.size() && std::isdigit(static_cast<unsigned char>(text[close]))) ++close;
      if (close == digits || close >= text.size() || text[close] != ')') fail();
      repeat = std::atoi(text.substr(digits, close - digits).c_str());
      pos = close + 1;
    }
    out.insert(out.end(), size_t(repeat), tasks);
    if (pos < text.size()) {
      if (text[pos] != ',') fail();
      ++pos;
      if (pos == text.size()) fail();
    }
  }
  if (out.empty()) fail();
  return out;
}

void parse_slurm(const Environment& env, LaunchInfo& info) {
  // srun sets SLURM_STEP_NUM_TASKS for the step; SLURM_NTASKS describes the allocation.
  const char* size_var = has(env, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  LauncherVars vars{"SLURM_PROCID", size_var, "SLURM_LOCALID", nullptr};
  read_numbers(env, vars, info);
  const char* list_var = has(env, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE"
                         : has(env, "SLURM_TASKS_PER_NODE")    ? "SLURM_TASKS_PER_NODE"
                                                               : nullptr;
  if (list_var) {
    const std::vector<int> per_node = parse_tasks_per_node(list_var, *find(env, list_var));
    const int node = has(env, "SLURM_NODEID") ? parse_int(env, "SLURM_NODEID") : 0;
    FSDP_CHECK(node >= 0 && size_t(node) < per_node.size(), LaunchError, "SLURM_NODEID=", node,
               " is not a node of ", list_var, "='", *find(env, list_var), "'");
    info.local_size = per_node[size_t(node)];
    vars.local_size = list_var;
  }
  validate(info, vars);
  info.mpi = has(env, "PMI_RANK") || has(env, "PMIX_RANK");
}

}  // namespace

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::Single: return "single";
    case Launcher::OpenMpi: return "openmpi";
    case Launcher::Mpich: return "mpich";
    case Launcher::Torchrun: return "torchrun";
    case Launcher::Slurm: return "slurm";
  }
  return "?";
}

LaunchInfo parse_launch_env(const Environment& env) {
  LaunchInfo info;
  if (has(env, "OMPI_COMM_WORLD_RANK") || has(env, "OMPI_COMM_WORLD_SIZE")) {
    info.launcher = Launcher::OpenMpi;
    const LauncherVars vars{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
    read_numbers(env, vars, info);
    validate(info, vars);
    info.mpi = true;
  } else if (has(env, "PMI_RANK") && has(env, "PMI_SIZE")) {
    info.launcher = Launcher::Mpich;
    const LauncherVars vars{"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};
    read_numbers(env, vars, info);
    validate(info, vars);
    info.mpi = true;
  } else if (has(env, "RANK") || has(env, "WORLD_SIZE")) {
    info.launcher = Launcher::Torchrun;
    const LauncherVars vars{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
    read_numbers(env, vars, info);
    validate(info, vars);
  } else if (has(env, "SLURM_PROCID")) {
    info.launcher = Launcher::Slurm;
    parse_slurm(env, info);
  }

  if (const std::string* addr = find(env, "MASTER_ADDR")) info.master_addr = *addr;
  if (has(env, "MASTER_PORT")) {
    info.master_port = parse_int(env, "MASTER_PORT");
    FSDP_CHECK(info.master_port > 0 && info.master_port < 65536, LaunchError, "MASTER_PORT=",
               info.master_port, " is not a TCP port (1..65535)");
  }
  FSDP_CHECK(info.master_addr.empty() == (info.master_port == 0), LaunchError,
             "MASTER_ADDR and MASTER_PORT must be set together, but only ",
             info.master_addr.empty() ? "MASTER_PORT" : "MASTER_ADDR", " is set");
  if (const std::string* id = find(env, "NCCL_COMM_ID")) {
    FSDP_CHECK(id->find(':') != std::string::npos, LaunchError, "NCCL_COMM_ID='", *id,
               "' must be host:port");
    info.nccl_comm_id = *id;
  }
  if (const std::string* file = find(env, "FSDP_RENDEZVOUS_FILE")) info.rendezvous_file = *file;
  if (const std::string* cvd = find(env, "CUDA_VISIBLE_DEVICES")) {
    info.cuda_visible_devices = *cvd;
    info.cuda_visible_devices_set = true;
  }
  return info;
}

Environment process_environment() {
  Environment env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text = *entry;
    const size_t eq = text.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  return env;
}

int cuda_device_for_local_rank(int local_rank, int visible_devices) {
  FSDP_CHECK(visible_devices > 0, DeviceError, "no CUDA device is visible to local rank ",
             local_rank, " (check CUDA_VISIBLE_DEVICES)");
  FSDP_CHECK(local_rank >= 0, LaunchError, "local rank ", local_rank, " is negative");
  return local_rank % visible_devices;
}

std::string physical_gpu(const LaunchInfo& launch, int index) {
  if (!launch.cuda_visible_devices_set) return std::to_string(index);
  std::vector<std::string> entries;
  size_t start = 0;
  const std::string& list = launch.cuda_visible_devices;
  while (start <= list.size()) {
    const size_t comma = list.find(',', start);
    const size_t end = comma == std::string::npos ? list.size() : comma;
    if (end > start) entries.push_back(list.substr(start, end - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (index >= 0 && size_t(index) < entries.size()) return entries[size_t(index)];
  return std::to_string(index);
}

LaunchInfo launch_alone(const LaunchInfo& launch) {
  LaunchInfo alone = launch;
  alone.rank = 0;
  alone.size = 1;
  alone.local_size = 1;
  return alone;
}

}  // namespace fsdp
