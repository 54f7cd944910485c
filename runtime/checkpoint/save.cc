#include "runtime/checkpoint/save.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "kernels/ops.h"
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

// This rank's file: its ranks in the groups that split and shard the state, which units
// it writes (those it holds the first replica of: all or none without expert parallelism),
// and its number among the files.
struct FilePosition {
  int tp_rank = 0, shard_rank = 0, ep_rank = 0, expert_shard_rank = 0;
  std::vector<bool> units;  // by unit index
  int index = 0, count = 1;
  bool writes() const { return std::find(units.begin(), units.end(), true) != units.end(); }
  // What files are numbered by.
  std::vector<int> order() const { return {tp_rank, shard_rank, ep_rank, expert_shard_rank}; }
};

FilePosition file_position(const ShardedModel& model, const DataParallelGroups& groups) {
  FilePosition p;
  p.tp_rank = groups.slices ? groups.slices->rank() : 0;
  p.shard_rank = groups.shard_rank();
  p.ep_rank = groups.parts ? groups.parts->rank() : 0;
  p.expert_shard_rank = groups.part_groups().shard_rank();
  for (int u = 0; u < model.num_units(); ++u) {
    const DataParallelGroups& g = model.unit_groups(u);
    const UnitPlan& plan = model.plan().units()[size_t(u)];
    FSDP_ASSERT(g.shard_rank() == (plan.part ? p.expert_shard_rank : p.shard_rank),
                "save_checkpoint: unit ", plan.name, " is not sharded over the groups given");
    p.units.push_back(!g.replicate || g.replicate->rank() == 0);
  }
  return p;
}

// Collective: numbers the files in the order of their positions, over the ranks that write
// one (without expert parallelism: tp_rank * shard_size + shard_rank).
void number_files(Context& ctx, Communicator* comm, FilePosition& p) {
  std::vector<std::vector<int>> writers;
  for (const std::string& text : all_gather_strings(ctx, comm, p.writes() ? Json(p.order()).dump() : ""))
    if (!text.empty()) writers.push_back(Json::parse(text).get<std::vector<int>>());
  std::sort(writers.begin(), writers.end());
  FSDP_ASSERT(std::adjacent_find(writers.begin(), writers.end()) == writers.end(),
              "two ranks would write the same shard file");
  p.count = int(writers.size());
  p.index = int(std::lower_bound(writers.begin(), writers.end(), p.order()) - writers.begin());
}

// Writes this rank's shards of the state (and `buffers`: rank 0's) into dir, flushed to
// disk; returns the file's record.
FileRecord write_shard_file(Context& ctx, const ShardedModel& model, const ShardState& state,
                            const FilePosition& at, const std::vector<ModelBuffer>& buffers,
                            const std::string& dir, const SaveOptions& options) {
  FileRecord record;
  record.name = shard_file_name(at.index, at.count);
  record.shard_rank = at.shard_rank;
  record.tp_rank = at.tp_rank;
  record.ep_rank = at.ep_rank;
  record.expert_shard_rank = at.expert_shard_rank;
  const std::string path = dir + "/" + record.name;
  const std::vector<UnitPlan>& units = model.plan().units();
  SafetensorsWriter writer(path, {{"format", "fsdp.cpp checkpoint shard"},
                                  {"shard", std::to_string(at.shard_rank)},
                                  {"tp_rank", std::to_string(at.tp_rank)},
                                  {"ep_rank", std::to_string(at.ep_rank)},
                                  {"expert_shard", std::to_string(at.expert_shard_rank)}});
  for (const std::string& kind : state.kinds())
    for (size_t u = 0; u < units.size(); ++u)
      if (at.units[u])
        writer.declare(state_tensor_name(kind, units[u].name), state.dtype(kind),
                       Shape{state.shard_numel(int(u))});
  std::vector<Tensor> buffer_values;  // on the host, in their own dtype
  for (const ModelBuffer& b : buffers) {
    buffer_values.push_back(ops::contiguous(ctx, ops::to_host(ctx, b.tensor)));
    writer.declare(state_tensor_name(kBuffer, b.name), b.tensor.dtype(), Shape{b.tensor.numel()});
  }
  reach(options, "shard_file_opened");
  auto write = [&](const std::string& name, const Tensor& host) {
    writer.write(name, host.numel() ? host.data_ptr() : nullptr, host.nbytes());
    record.tensors.push_back({name, host.dtype(), host.numel(), ""});
    reach(options, "tensor_written:" + name);
  };
  // One unit's state at a time on the host: memory stays at the largest unit shard.
  for (const std::string& kind : state.kinds())
    for (size_t u = 0; u < units.size(); ++u)
      if (at.units[u]) write(state_tensor_name(kind, units[u].name), state.to_host(ctx, int(u), kind));
  for (size_t i = 0; i < buffers.size(); ++i)
    write(state_tensor_name(kBuffer, buffers[i].name), buffer_values[i]);
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
// the metadata of every rank's files), as text for all_gather_strings.
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
  return Json{{"name", r.name},       {"shard_rank", r.shard_rank}, {"tp_rank", r.tp_rank},
              {"ep_rank", r.ep_rank}, {"expert_shard_rank", r.expert_shard_rank},
              {"bytes", r.bytes},     {"sha256", r.sha256},         {"tensors", tensors},
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
  r.ep_rank = j.at("ep_rank").get<int>();
  r.expert_shard_rank = j.at("expert_shard_rank").get<int>();
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

// Parameter `name`'s slice on the ranks whose files `holds` picks: every rank of a
// tensor- or expert-parallel group's rank holds the same slices, so any of their files says.
const nn::ParallelSlice& slice_in_files(const std::vector<WrittenFile>& written, const std::string& name,
                                        const std::function<bool(const FileRecord&)>& holds,
                                        const std::string& which) {
  for (const WrittenFile& w : written) {
    auto it = w.slices.find(name);
    if (holds(w.record) && it != w.slices.end()) return it->second;
  }
  FSDP_THROW(InternalError, "save_checkpoint: no file of ", which, " records the slice of ", name);
}

// The metadata of the checkpoint: the plan's layout, each parameter's pieces, the files.
// Every rank runs the same plan (equal slices), so rank 0's plan places the elements of
// every file; the slices say which elements of the whole parameter they are.
CheckpointMetadata build_metadata(const ShardedModel& model, const Optimizer* optimizer,
                                  const ShardState& state, const DataParallelGroups& groups,
                                  int world_size, const TrainingProgress& progress,
                                  std::vector<WrittenFile> written, const std::vector<ModelBuffer>& buffers,
                                  const std::string& buffers_file) {
  const ShardingPlan& plan = model.plan();
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
  m.tensor_parallel = groups.slices ? groups.slices->size() : 1;
  m.expert_parallel = groups.parts_size();
  m.expert_shard_size = groups.part_groups().shard_size();
  m.mesh = progress.mesh;
  m.plan_hash = plan.hash();
  m.shard_block = plan.options().block;
  m.main_dtype = state.dtype(kMainWeights);
  if (optimizer) {
    m.optimizer = optimizer_kind_name(optimizer->config().kind);
    m.optimizer_steps = optimizer->steps_taken();
    if (m.optimizer != "sgd") m.moments_dtype = state.dtype(kExpAvg);
  }
  auto position = [](const FileRecord& r) {
    return std::make_tuple(r.tp_rank, r.shard_rank, r.ep_rank, r.expert_shard_rank);
  };
  std::sort(written.begin(), written.end(), [&](const WrittenFile& a, const WrittenFile& b) {
    return position(a.record) < position(b.record);
  });
  for (size_t i = 0; i < written.size(); ++i)
    FSDP_ASSERT(written[i].record.name == shard_file_name(int(i), int(written.size())),
                "shard file ", written[i].record.name, " is not numbered by its position");
  for (const UnitPlan& u : plan.units()) {
    m.units.push_back({u.name, u.numel, u.padded_numel, u.shard_numel, u.params, u.part});
    const size_t first = m.params.size();
    for (const ParamPlacement& p : u.params) {
      ParamRecord r{p.name, p.shape, u.name, {}, {}, {}};
      if (u.part) {
        for (int e = 0; e < m.expert_parallel; ++e)
          r.ep_slices.push_back(slice_in_files(written, p.name,
              [e](const FileRecord& f) { return f.ep_rank == e; }, str_cat("expert-parallel rank ", e)));
        r.shape = r.ep_slices[0].full_shape;
      } else if (written[0].slices.count(p.name)) {
        for (int t = 0; t < m.tensor_parallel; ++t)
          r.tp_slices.push_back(slice_in_files(written, p.name,
              [t](const FileRecord& f) { return f.tp_rank == t; }, str_cat("tensor-parallel rank ", t)));
        r.shape = r.tp_slices[0].full_shape;
      }
      m.params.push_back(std::move(r));
    }
    const std::string tensor = state_tensor_name(kMainWeights, u.name);
    for (size_t f = 0; f < written.size(); ++f) {
      const FileRecord& file = written[f].record;
      if (!file.find_tensor(tensor)) continue;  // not a writer of this unit
      const int shard = u.part ? file.expert_shard_rank : file.shard_rank;
      for (const ShardSegment& s : u.segments(shard)) {
        ParamRecord& r = m.params[first + size_t(s.param)];
        // Slices of the whole parameter, by global coordinates: an expert-parallel rank's
        // experts, or a tensor-parallel rank's part, of which a range several ranks hold
        // (replicated key/value heads) is read from its owner's files. Whole parameters, and
        // experts, are the same on every tensor-parallel rank: read from rank 0's files.
        std::vector<nn::ParallelSlice::Run> runs;
        if (!r.ep_slices.empty()) {
          if (file.tp_rank == 0) runs = r.ep_slices[size_t(file.ep_rank)].runs(s.param_offset, s.numel);
        } else if (!r.tp_slices.empty()) {
          runs = r.tp_slices[size_t(file.tp_rank)].owned_runs(s.param_offset, s.numel, file.tp_rank);
        } else if (file.tp_rank == 0) {
          runs.push_back({s.param_offset, s.param_offset, s.numel, 1});
        }
        for (const nn::ParallelSlice::Run& run : runs)
          r.pieces.push_back({int(f), s.shard_offset + (run.local - s.param_offset), run.full, run.numel});
      }
    }
    for (size_t k = first; k < m.params.size(); ++k)
      std::sort(m.params[k].pieces.begin(), m.params[k].pieces.end(),
                [](const ParamPiece& a, const ParamPiece& b) { return a.param_offset < b.param_offset; });
  }
  for (WrittenFile& w : written) m.files.push_back(std::move(w.record));
  for (const ModelBuffer& b : buffers) {
    BufferRecord r{b.name, b.tensor.shape(), -1};
    for (size_t f = 0; f < m.files.size(); ++f)
      if (m.files[f].name == buffers_file) r.file = int(f);
    FSDP_ASSERT(r.file >= 0, "the buffers' file ", buffers_file, " was not written");
    m.buffers.push_back(std::move(r));
  }
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
  for (const ModelBuffer& b : options.buffers)
    FSDP_CHECK(b.tensor.defined() && !b.name.empty(), CheckpointError, "save_checkpoint: buffer \"",
               b.name, "\" has no tensor");
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
    // 2. The first replica of each shard writes it; rank 0 (the first replica of every
    // shard it holds) adds the buffers.
    FilePosition position;
    run_on_every_rank(ctx, comm, [&] {
      position = file_position(model, groups);
      FSDP_ASSERT(rank != 0 || position.writes(), "rank 0 holds the first replica of its shards");
    });
    number_files(ctx, comm, position);
    const std::vector<ModelBuffer> no_buffers;
    std::string record, buffers_file;
    run_on_every_rank(ctx, comm, [&] {
      if (!position.writes()) return;
      WrittenFile w{write_shard_file(ctx, model, state, position, rank == 0 ? options.buffers : no_buffers,
                                     temp_dir, options),
                    slices_of(model)};
      if (rank == 0) buffers_file = w.record.name;
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
      const CheckpointMetadata m = build_metadata(model, optimizer, state, groups, world_size, progress,
                                                  std::move(files), options.buffers, buffers_file);
      const std::string meta_path = temp_dir + "/" + kMetadataFileName;
      // What a load will check, checked before anything is committed: a layout this save
      // cannot describe fails it rather than leaving a checkpoint that does not load.
      const std::string text = m.to_json();
      CheckpointMetadata::parse(text, meta_path);
      write_file_atomically(meta_path, text);
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
