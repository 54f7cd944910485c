#include "runtime/checkpoint/save.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint/durable_files.h"
#include "runtime/checkpoint/file_digest.h"
#include "runtime/checkpoint/metadata.h"
#include "runtime/checkpoint/rank_agreement.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/shard_state.h"

namespace fsdp::checkpoint {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kLatestMarker = "latest";
constexpr const char* kTempPrefix = ".tmp_";

void reach(const SaveOptions& options, const std::string& point) {
  if (options.fault_hook) options.fault_hook(point);
}

// Rank 0, before anything is written: clears what interrupted saves left behind and creates
// the temporary directory this save writes into.
void prepare_directories(const std::string& save_dir, const std::string& temp_dir) {
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  FSDP_CHECK(!ec, IoError, save_dir, ": cannot create the checkpoint directory: ", ec.message());
  for (const fs::directory_entry& e : fs::directory_iterator(save_dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kTempPrefix, 0) == 0) fs::remove_all(e.path());
  }
  FSDP_CHECK(fs::create_directory(temp_dir, ec) && !ec, IoError, temp_dir, ": cannot create: ",
             ec ? ec.message() : "it exists");
}

// Which shard file this rank writes (its first replica's): tensor-parallel rank t's files
// follow rank t - 1's.
struct FilePosition {
  int shard_rank = 0, shard_size = 1, tp_rank = 0, tp_size = 1;
  int index() const { return tp_rank * shard_size + shard_rank; }
  int count() const { return tp_size * shard_size; }
};

FilePosition file_position(const DataParallelGroups& groups) {
  FilePosition p;
  p.shard_rank = groups.shard_rank();
  p.shard_size = groups.shard_size();
  if (groups.tensor_parallel) {
    p.tp_rank = groups.tensor_parallel->rank();
    p.tp_size = groups.tensor_parallel->size();
  }
  return p;
}

// Writes this rank's shard of the state into dir, flushed to disk; returns its record.
FileRecord write_shard_file(Context& ctx, const ShardedModel& model, const ShardState& state,
                            const FilePosition& at, const std::string& dir,
                            const SaveOptions& options) {
  FileRecord record;
  record.name = shard_file_name(at.index(), at.count());
  record.shard_rank = at.shard_rank;
  record.tp_rank = at.tp_rank;
  const std::string path = dir + "/" + record.name;
  const std::vector<UnitPlan>& units = model.plan().units();
  SafetensorsWriter writer(path, {{"format", "fsdp.cpp checkpoint shard"},
                                  {"shard", std::to_string(at.shard_rank)},
                                  {"shards", std::to_string(at.shard_size)},
                                  {"tp_rank", std::to_string(at.tp_rank)},
                                  {"tp_size", std::to_string(at.tp_size)}});
  for (const std::string& kind : state.kinds())
    for (size_t u = 0; u < units.size(); ++u)
      writer.declare(state_tensor_name(kind, units[u].name), state.dtype(kind),
                     Shape{state.shard_numel(int(u))});
  reach(options, "shard_file_opened");
  // One unit's state at a time on the host: memory stays at the largest unit shard.
  for (const std::string& kind : state.kinds()) {
    for (size_t u = 0; u < units.size(); ++u) {
      const std::string name = state_tensor_name(kind, units[u].name);
      const Tensor host = state.to_host(ctx, int(u), kind);
      writer.write(name, host.numel() ? host.data_ptr() : nullptr, host.nbytes());
      record.tensors.push_back({name, host.dtype(), host.numel(), ""});
      reach(options, "tensor_written:" + name);
    }
  }
  writer.finish();
  // The digests are of what is in the file now, read back once; then it goes to disk.
  const FileDigest digest = digest_safetensors_file(path);
  fsync_path(path);
  record.bytes = digest.bytes;
  record.sha256 = digest.sha256;
  for (TensorRecord& t : record.tensors) t.sha256 = digest.tensors.at(t.name);
  reach(options, "shard_file_written");
  return record;
}

// A written file's record, and the slices of this rank's sliced parameters (rank 0 writes
// the metadata of every tensor-parallel rank's files), as text for all_gather_strings.
struct WrittenFile {
  FileRecord record;
  std::map<std::string, nn::ParallelSlice> slices;  // by parameter name
};

std::string written_to_text(const WrittenFile& w) {
  const FileRecord& r = w.record;
  Json tensors = Json::array();
  for (const TensorRecord& t : r.tensors)
    tensors.push_back({t.name, safetensors_dtype_name(t.dtype), t.numel, t.sha256});
  Json slices = Json::object();
  for (const auto& [name, sl] : w.slices)
    slices[name] = {{"full_shape", sl.full_shape.dims()}, {"dim", sl.dim}, {"ranges", sl.ranges},
                    {"replicas", sl.replicas}};
  return Json{{"name", r.name},     {"shard_rank", r.shard_rank}, {"tp_rank", r.tp_rank},
              {"bytes", r.bytes},   {"sha256", r.sha256},         {"tensors", tensors},
              {"slices", slices}}
      .dump();
}

std::map<std::string, nn::ParallelSlice> slices_of(const ShardedModel& model) {
  std::map<std::string, nn::ParallelSlice> out;
  for (const UnitPlan& u : model.plan().units())
    for (const ParamPlacement& p : u.params) {
      const nn::Parameter* param = const_cast<ShardedModel&>(model).model().find_parameter(p.name);
      if (param && param->parallel_slice()) out[p.name] = *param->parallel_slice();
    }
  return out;
}

WrittenFile written_from_text(const std::string& text) {
  const Json j = Json::parse(text);
  WrittenFile w;
  FileRecord& r = w.record;
  r.name = j.at("name").get<std::string>();
  r.shard_rank = j.at("shard_rank").get<int>();
  r.tp_rank = j.at("tp_rank").get<int>();
  r.bytes = j.at("bytes").get<uint64_t>();
  r.sha256 = j.at("sha256").get<std::string>();
  for (const Json& t : j.at("tensors"))
    r.tensors.push_back({t.at(0).get<std::string>(), dtype_from_safetensors(t.at(1).get<std::string>()),
                         t.at(2).get<int64_t>(), t.at(3).get<std::string>()});
  for (const auto& [name, sl] : j.at("slices").items()) {
    nn::ParallelSlice slice;
    slice.full_shape = Shape(sl.at("full_shape").get<std::vector<int64_t>>());
    slice.dim = sl.at("dim").get<int>();
    slice.ranges = sl.at("ranges").get<std::vector<std::pair<int64_t, int64_t>>>();
    slice.replicas = sl.at("replicas").get<std::vector<int>>();
    w.slices[name] = slice;
  }
  return w;
}

// The metadata of the checkpoint: the plan's layout, each parameter's pieces, the files.
// Every tensor-parallel rank runs the same plan (equal slices), so rank 0's plan places
// the elements of every file; the slices say which elements of the whole parameter they are.
CheckpointMetadata build_metadata(const ShardedModel& model, const Optimizer* optimizer,
                                  const ShardState& state, const DataParallelGroups& groups,
                                  int world_size, const TrainingProgress& progress,
                                  std::vector<WrittenFile> written) {
  const ShardingPlan& plan = model.plan();
  const FilePosition here = file_position(groups);
  CheckpointMetadata m;
  m.step = progress.step;
  m.consumed_samples = progress.consumed_samples;
  m.consumed_tokens = progress.consumed_tokens;
  m.init_seed = progress.init_seed;
  m.data_seed = progress.data_seed;
  m.strategy = strategy_name(plan.strategy());
  m.world_size = world_size;
  m.shard_size = groups.shard_size();
  m.replicas = groups.replicate_size();
  m.tensor_parallel = here.tp_size;
  m.mesh = progress.mesh;
  m.plan_hash = plan.hash();
  m.shard_block = plan.options().block;
  m.main_dtype = state.dtype(kMainWeights);
  if (optimizer) {
    m.optimizer = optimizer_kind_name(optimizer->config().kind);
    m.optimizer_steps = optimizer->steps_taken();
    if (m.optimizer == "adamw") m.moments_dtype = state.dtype(kExpAvg);
  }
  std::sort(written.begin(), written.end(), [](const WrittenFile& a, const WrittenFile& b) {
    return std::make_pair(a.record.tp_rank, a.record.shard_rank) <
           std::make_pair(b.record.tp_rank, b.record.shard_rank);
  });
  FSDP_ASSERT(int(written.size()) == here.count(), written.size(), " shard files for ",
              here.count(), " shards");
  for (size_t i = 0; i < written.size(); ++i) {
    FilePosition at = here;
    at.tp_rank = written[i].record.tp_rank;
    at.shard_rank = written[i].record.shard_rank;
    FSDP_ASSERT(at.index() == int(i), "shard files do not cover each shard of each "
                "tensor-parallel rank once");
  }
  for (const UnitPlan& u : plan.units()) {
    m.units.push_back({u.name, u.numel, u.padded_numel, u.shard_numel, u.params});
    const size_t first = m.params.size();
    for (const ParamPlacement& p : u.params) {
      ParamRecord r{p.name, p.shape, u.name, {}, {}};
      if (written[0].slices.count(p.name)) {
        for (int t = 0; t < here.tp_size; ++t)
          r.tp_slices.push_back(written[size_t(t * here.shard_size)].slices.at(p.name));
        r.shape = r.tp_slices[0].full_shape;
      }
      m.params.push_back(std::move(r));
    }
    for (size_t f = 0; f < written.size(); ++f) {
      const int t = written[f].record.tp_rank, shard = written[f].record.shard_rank;
      for (const ShardSegment& s : u.segments(shard)) {
        ParamRecord& r = m.params[first + size_t(s.param)];
        if (r.tp_slices.empty()) {
          // Whole on every tensor-parallel rank: read from rank 0's files.
          if (t == 0) r.pieces.push_back({int(f), s.shard_offset, s.param_offset, s.numel});
          continue;
        }
        // A range several ranks hold (replicated key/value heads) is read from its owner's files.
        for (const nn::ParallelSlice::Run& run :
             r.tp_slices[size_t(t)].owned_runs(s.param_offset, s.numel, t))
          r.pieces.push_back({int(f), s.shard_offset + (run.local - s.param_offset), run.full, run.numel});
      }
    }
    for (size_t k = first; k < m.params.size(); ++k)
      std::sort(m.params[k].pieces.begin(), m.params[k].pieces.end(),
                [](const ParamPiece& a, const ParamPiece& b) { return a.param_offset < b.param_offset; });
  }
  for (WrittenFile& w : written) m.files.push_back(std::move(w.record));
  m.recipe_json = progress.recipe_json;
  return m;
}

// The complete checkpoints in save_dir (step directories holding metadata.json), by step.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& save_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const fs::directory_entry& e : fs::directory_iterator(save_dir)) {
    const std::string name = e.path().filename().string();
    const int64_t step = step_of_directory_name(name);
    if (step >= 0 && file_size_or_missing(e.path().string() + "/" + kMetadataFileName) >= 0)
      out.emplace_back(step, name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Rank 0, once every file is on disk: moves the finished temporary directory to its step
// name and points `latest` at it. At every moment `latest` names a complete checkpoint (or,
// while the only one is being replaced by a save of the same step, is absent).
void install_step_directory(const std::string& save_dir, const std::string& temp_dir,
                            const std::string& step_name, const SaveOptions& options) {
  const std::string final_dir = save_dir + "/" + step_name;
  const std::string latest_path = save_dir + "/" + kLatestMarker;
  if (fs::exists(final_dir)) {
    // This step was saved before (by an earlier run, or an interrupted save): replace it.
    if (read_latest_marker(save_dir) == step_name) {
      std::string fallback;
      for (const auto& [step, name] : complete_checkpoints(save_dir))
        if (name != step_name) fallback = name;  // the newest other one
      if (fallback.empty()) {
        fs::remove(latest_path);
        fsync_path(save_dir);
      } else {
        write_file_atomically(latest_path, fallback + "\n");
      }
    }
    // Moved aside under a temporary name, which the next save clears if this one dies.
    const std::string aside = save_dir + "/" + kTempPrefix + "replaced_" + step_name;
    rename_durably(final_dir, aside);
    rename_durably(temp_dir, final_dir);
    reach(options, "renamed");
    write_file_atomically(latest_path, step_name + "\n");
    reach(options, "latest_written");
    fs::remove_all(aside);
    return;
  }
  rename_durably(temp_dir, final_dir);
  reach(options, "renamed");
  write_file_atomically(latest_path, step_name + "\n");
  reach(options, "latest_written");
}

// Deletes complete checkpoints beyond the newest `keep` (by step), never `latest`. Returns
// a warning for what could not be removed (the save itself has succeeded by then).
std::string prune_checkpoints(const std::string& save_dir, int keep, const std::string& latest) {
  if (keep <= 0) return "";
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const fs::directory_entry& e : fs::directory_iterator(save_dir)) {
    const int64_t step = step_of_directory_name(e.path().filename().string());
    if (step >= 0 && e.is_directory()) steps.emplace_back(step, e.path());
  }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string warning;
  for (size_t i = size_t(keep); i < steps.size(); ++i) {
    if (steps[i].second.filename() == latest) continue;
    std::error_code ec;
    fs::remove_all(steps[i].second, ec);
    if (ec) warning += str_cat("cannot remove old checkpoint ", steps[i].second.string(), ": ", ec.message(), "; ");
  }
  return warning;
}

}  // namespace

std::string read_latest_marker(const std::string& save_dir) {
  const std::string path = save_dir + "/" + kLatestMarker;
  if (file_size_or_missing(path) < 0) return "";
  std::string name = read_text_file(path);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
    name.pop_back();
  FSDP_CHECK(step_of_directory_name(name) >= 0, CheckpointError, path, ": holds \"", name,
             "\", not the name of a step directory (step_NNNNNN)");
  return name;
}

SaveResult save_checkpoint(Context& ctx, Communicator* comm, const ShardedModel& model,
                           const Optimizer* optimizer, const DataParallelGroups& groups,
                           const TrainingProgress& progress, const std::string& save_dir,
                           const SaveOptions& options) {
  const int rank = comm ? comm->rank() : 0;
  const int world_size = comm ? comm->size() : 1;
  FSDP_ASSERT(groups.shard_size() == model.shard_size() && groups.shard_rank() == model.shard_rank(),
              "save_checkpoint: the groups are not the ones the model was sharded with");
  const ShardState state(model, optimizer);
  const std::string step_name = step_directory_name(progress.step);
  const std::string final_dir = save_dir + "/" + step_name;
  const std::string temp_dir = save_dir + "/" + kTempPrefix + step_name;
  SaveResult result;
  result.directory = final_dir;

  // 1. Rank 0 prepares the directories.
  run_on_every_rank(ctx, comm, [&] {
    if (rank == 0) prepare_directories(save_dir, temp_dir);
  });

  // A failed save (every rank throws together) takes back what it wrote, so that a full
  // disk is not kept full by the attempt; `latest` and the complete steps are untouched.
  std::string warning;
  try {
    // 2. The first replica of each shard writes it.
    const bool writer = !groups.replicate || groups.replicate->rank() == 0;
    std::string record;
    run_on_every_rank(ctx, comm, [&] {
      if (!writer) return;
      WrittenFile w{write_shard_file(ctx, model, state, file_position(groups), temp_dir, options),
                    slices_of(model)};
      record = written_to_text(w);
    });
    std::vector<WrittenFile> files;
    for (const std::string& text : all_gather_strings(ctx, comm, record)) {
      if (text.empty()) continue;
      files.push_back(written_from_text(text));
      result.bytes += files.back().record.bytes;
    }

    // 3. Every shard is on disk: rank 0 commits (metadata, rename, latest), then prunes.
    run_on_every_rank(ctx, comm, [&] {
      if (rank != 0) return;
      const CheckpointMetadata m =
          build_metadata(model, optimizer, state, groups, world_size, progress, std::move(files));
      const std::string meta_path = temp_dir + "/" + kMetadataFileName;
      write_file_atomically(meta_path, m.to_json());
      reach(options, "metadata_written");
      fsync_path(temp_dir);
      install_step_directory(save_dir, temp_dir, step_name, options);
      warning = prune_checkpoints(save_dir, options.most_recent_k, step_name);
    });
  } catch (...) {
    if (rank == 0) {
      std::error_code ignored;
      fs::remove_all(temp_dir, ignored);
    }
    throw;
  }
  result.warning = all_gather_strings(ctx, comm, warning)[0];
  return result;
}

}  // namespace fsdp::checkpoint
