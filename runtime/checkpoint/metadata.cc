#include "runtime/checkpoint/metadata.h"

#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/sha256.h"
#include "runtime/core/error.h"
#include "runtime/core/json_depth.h"

namespace fsdp::checkpoint {
namespace {

using Json = nlohmann::ordered_json;

// Typed access to the parsed JSON: every miss is a CheckpointError naming the source and
// the key path ("metadata.json: layout.units[3].shard_numel: expected an integer").
class Fields {
 public:
  explicit Fields(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    FSDP_THROW(CheckpointError, source_, ": ", path, ": ", what);
  }
  const Json& member(const Json& obj, const std::string& path, const std::string& key) const {
    if (!obj.is_object()) fail(path, "expected an object");
    auto it = obj.find(key);
    if (it == obj.end()) fail(path.empty() ? key : path + "." + key, "missing");
    return *it;
  }
  int64_t integer(const Json& v, const std::string& path) const {
    if (!v.is_number_integer()) fail(path, "expected an integer");
    return v.get<int64_t>();
  }
  int64_t count(const Json& v, const std::string& path) const {
    const int64_t n = integer(v, path);
    if (n < 0) fail(path, "must not be negative");
    return n;
  }
  std::string text(const Json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, "expected a string");
    return v.get<std::string>();
  }
  bool boolean(const Json& v, const std::string& path) const {
    if (!v.is_boolean()) fail(path, "expected true or false");
    return v.get<bool>();
  }
  const Json& array(const Json& v, const std::string& path) const {
    if (!v.is_array()) fail(path, "expected an array");
    return v;
  }
  Shape shape(const Json& v, const std::string& path) const {
    std::vector<int64_t> dims;
    for (size_t i = 0; i < array(v, path).size(); ++i)
      dims.push_back(count(v[i], path + "[" + std::to_string(i) + "]"));
    return Shape(dims);
  }
  DType dtype(const Json& v, const std::string& path) const {
    const std::string name = text(v, path);
    try {
      return dtype_from_safetensors(name);
    } catch (const CheckpointError& e) {
      fail(path, e.what());
    }
  }

 private:
  std::string source_;
};

Json shape_json(const Shape& s) {
  Json a = Json::array();
  for (int64_t d : s.dims()) a.push_back(d);
  return a;
}

std::string hex64(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Json slices_json(const std::vector<nn::ParallelSlice>& slices) {
  Json out = Json::array();
  for (const nn::ParallelSlice& sl : slices) {
    Json ranges = Json::array();
    for (const auto& [b, e] : sl.ranges) ranges.push_back({b, e});
    Json slice = {{"dim", sl.dim}, {"ranges", ranges}};
    if (!sl.replicas.empty()) slice["replicas"] = sl.replicas;  // ranges held by several ranks
    out.push_back(slice);
  }
  return out;
}

// A parameter's "tp_slices" or "ep_slices": slices of its whole shape.
std::vector<nn::ParallelSlice> parse_slices(const Json& v, const Shape& shape, const Fields& f,
                                            const std::string& at) {
  std::vector<nn::ParallelSlice> out;
  const Json& slices = f.array(v, at);
  for (size_t k = 0; k < slices.size(); ++k) {
    const std::string kat = at + "[" + std::to_string(k) + "]";
    nn::ParallelSlice slice;
    slice.full_shape = shape;
    slice.dim = int(f.count(f.member(slices[k], kat, "dim"), kat + ".dim"));
    const Json& ranges = f.array(f.member(slices[k], kat, "ranges"), kat + ".ranges");
    for (size_t q = 0; q < ranges.size(); ++q) {
      const std::string rat = kat + ".ranges[" + std::to_string(q) + "]";
      if (!ranges[q].is_array() || ranges[q].size() != 2) f.fail(rat, "expected [begin, end]");
      slice.ranges.emplace_back(f.count(ranges[q][0], rat + "[0]"), f.count(ranges[q][1], rat + "[1]"));
    }
    if (slices[k].contains("replicas")) {
      const std::string rat = kat + ".replicas";
      const Json& replicas = f.array(slices[k]["replicas"], rat);
      for (size_t q = 0; q < replicas.size(); ++q) {
        const std::string qat = rat + "[" + std::to_string(q) + "]";
        const int64_t n = f.count(replicas[q], qat);
        if (n > (int64_t(1) << 20)) f.fail(qat, str_cat(n, " ranks holding one range"));
        slice.replicas.push_back(int(n));
      }
    }
    try {
      slice.check();
    } catch (const ShapeError& e) {
      f.fail(kat, e.what());
    }
    out.push_back(std::move(slice));
  }
  return out;
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos;
}

// Checks every parameter's pieces against the files' tensors.
// The unit record and placement the layout gives parameter `p`; fails naming `where`.
std::pair<const UnitRecord*, const ParamPlacement*> placement_of(const CheckpointMetadata& m,
                                                                 const ParamRecord& p,
                                                                 const Fields& f,
                                                                 const std::string& where) {
  for (const UnitRecord& u : m.units) {
    if (u.name != p.unit) continue;
    for (const ParamPlacement& pl : u.params)
      if (pl.name == p.name) return {&u, &pl};
    f.fail(where, str_cat("unit \"", p.unit, "\" of the layout does not place it"));
  }
  f.fail(where, str_cat("its unit \"", p.unit, "\" is not in the layout"));
  return {nullptr, nullptr};
}

// Checks a sliced parameter's slices (one per rank of the group that splits it) against
// its whole shape and the layout's shape of a slice.
void check_slices(const std::vector<nn::ParallelSlice>& slices, int ranks, const char* group,
                  const ParamRecord& p, const ParamPlacement& placement, const Fields& f,
                  const std::string& at) {
  if (int(slices.size()) != ranks)
    f.fail(at, str_cat(slices.size(), " slices for ", ranks, " ", group, " ranks"));
  for (const nn::ParallelSlice& slice : slices) {
    if (!(slice.full_shape == p.shape) || !(slice.local_shape() == placement.shape))
      f.fail(at, str_cat("slice ", slice.str(), " does not take the layout's ",
                         placement.shape.str(), " from ", p.shape.str()));
  }
}

void check_pieces(const CheckpointMetadata& m, const Fields& f) {
  const std::vector<std::string> kinds = m.state_kinds();
  for (const ParamRecord& p : m.params) {
    const std::string where = "parameters." + p.name;
    const auto [unit, placement] = placement_of(m, p, f, where);
    // An experts unit holds expert parameters only, each split over the expert-parallel
    // ranks (and not by tensor parallelism as well: no layout does both).
    if (unit->experts != !p.ep_slices.empty())
      f.fail(where, unit->experts ? str_cat("is in experts unit \"", unit->name, "\" but has no ep_slices")
                                  : str_cat("has ep_slices but its unit \"", unit->name, "\" is not an experts unit"));
    if (!p.tp_slices.empty() && !p.ep_slices.empty())
      f.fail(where, "has both tp_slices and ep_slices");
    if (p.tp_slices.empty() && p.ep_slices.empty() && !(placement->shape == p.shape))
      f.fail(where, str_cat("shape ", p.shape.str(), " differs from the layout's ", placement->shape.str()));
    if (!p.tp_slices.empty())
      check_slices(p.tp_slices, m.tensor_parallel, "tensor-parallel", p, *placement, f, where + ".tp_slices");
    if (!p.ep_slices.empty())
      check_slices(p.ep_slices, m.expert_parallel, "expert-parallel", p, *placement, f, where + ".ep_slices");
    int64_t covered = 0;
    for (size_t i = 0; i < p.pieces.size(); ++i) {
      const ParamPiece& piece = p.pieces[i];
      const std::string at = where + ".pieces[" + std::to_string(i) + "]";
      if (piece.file < 0 || size_t(piece.file) >= m.files.size())
        f.fail(at, str_cat("file index ", piece.file, " is not one of the ", m.files.size(), " files"));
      if (piece.param_offset != covered)
        f.fail(at, str_cat("starts at element ", piece.param_offset, " but the pieces before it end at ",
                           covered, " (pieces must cover the parameter once, in order)"));
      if (piece.numel <= 0) f.fail(at, "is empty");
      covered += piece.numel;
      const FileRecord& file = m.files[size_t(piece.file)];
      // The part of the parameter that file's ranks hold (null: all of it)...
      const nn::ParallelSlice* slice = nullptr;
      std::string holder;
      if (!p.ep_slices.empty()) {
        slice = &p.ep_slices[size_t(file.ep_rank)];
        holder = str_cat("expert-parallel rank ", file.ep_rank);
      } else if (!p.tp_slices.empty()) {
        slice = &p.tp_slices[size_t(file.tp_rank)];
        holder = str_cat("tensor-parallel rank ", file.tp_rank);
      }
      // ...where these elements are in it...
      const int64_t local = slice ? slice->local_of(piece.param_offset, piece.numel) : piece.param_offset;
      if (local < 0)
        f.fail(at, str_cat("elements [", piece.param_offset, ", ", piece.param_offset + piece.numel,
                           ") are not one run of the slice of ", holder));
      // ...and where the layout puts them in that file's shard of the unit: a piece that
      // says otherwise would load shifted weights.
      const int shard_rank = unit->experts ? file.expert_shard_rank : file.shard_rank;
      const int64_t expected = placement->offset + local - int64_t(shard_rank) * unit->shard_numel;
      if (piece.tensor_offset != expected)
        f.fail(at, str_cat("tensor offset ", piece.tensor_offset, " disagrees with the layout, which "
                           "puts element ", piece.param_offset, " of the parameter at ", expected,
                           " in file ", file.name));
      for (const std::string& kind : kinds) {
        const std::string tname = state_tensor_name(kind, p.unit);
        const TensorRecord* t = file.find_tensor(tname);
        if (!t) f.fail(at, str_cat("file ", file.name, " lists no tensor \"", tname, "\""));
        if (t->dtype != m.dtype_of_kind(kind))
          f.fail(at, str_cat("file ", file.name, " tensor \"", tname, "\" is ",
                             safetensors_dtype_name(t->dtype), ", expected ",
                             safetensors_dtype_name(m.dtype_of_kind(kind))));
        if (piece.tensor_offset < 0 || piece.tensor_offset + piece.numel > t->numel)
          f.fail(at, str_cat("elements [", piece.tensor_offset, ", ", piece.tensor_offset + piece.numel,
                             ") are outside tensor \"", tname, "\" of ", t->numel, " elements in ",
                             file.name));
      }
    }
    if (covered != p.shape.numel())
      f.fail(where, str_cat("the pieces cover ", covered, " elements of ", p.shape.numel(), " ",
                            p.shape.str()));
  }
}

// Every file's ranks are ranks of the layout's groups.
void check_files(const CheckpointMetadata& m, const Fields& f) {
  for (size_t i = 0; i < m.files.size(); ++i) {
    const FileRecord& file = m.files[i];
    const std::string at = "files[" + std::to_string(i) + "]";
    for (const auto& [key, rank, size] :
         {std::tuple<const char*, int, int>{"shard_rank", file.shard_rank, m.shard_size},
          {"tp_rank", file.tp_rank, m.tensor_parallel},
          {"ep_rank", file.ep_rank, m.expert_parallel},
          {"expert_shard_rank", file.expert_shard_rank, m.expert_shard_size}})
      if (rank >= size)
        f.fail(at + "." + key, str_cat(rank, " is not a rank of ", size, " (file ", file.name, ")"));
  }
}

// Every buffer's tensor is in its file, with the buffer's size.
void check_buffers(const CheckpointMetadata& m, const Fields& f) {
  for (const BufferRecord& b : m.buffers) {
    const std::string at = "buffers." + b.name;
    if (b.file < 0 || size_t(b.file) >= m.files.size())
      f.fail(at + ".file", str_cat("file index ", b.file, " is not one of the ", m.files.size(), " files"));
    const FileRecord& file = m.files[size_t(b.file)];
    const std::string tname = state_tensor_name(kBuffer, b.name);
    const TensorRecord* t = file.find_tensor(tname);
    if (!t) f.fail(at, str_cat("file ", file.name, " lists no tensor \"", tname, "\""));
    if (t->numel != b.shape.numel())
      f.fail(at, str_cat("file ", file.name, " tensor \"", tname, "\" has ", t->numel,
                         " elements for shape ", b.shape.str()));
  }
}

}  // namespace

std::string state_tensor_name(const std::string& kind, const std::string& unit) {
  return kind + "/" + unit;
}

const TensorRecord* FileRecord::find_tensor(const std::string& tensor_name) const {
  for (const TensorRecord& t : tensors)
    if (t.name == tensor_name) return &t;
  return nullptr;
}

std::vector<std::string> CheckpointMetadata::state_kinds() const {
  if (moments_dtype) return {kMainWeights, kExpAvg, kExpAvgSq};
  return {kMainWeights};
}

DType CheckpointMetadata::dtype_of_kind(const std::string& kind) const {
  if (kind == kMainWeights) return main_dtype;
  FSDP_CHECK((kind == kExpAvg || kind == kExpAvgSq) && moments_dtype, CheckpointError,
             "this checkpoint holds no state \"", kind, "\"");
  return *moments_dtype;
}

const ParamRecord* CheckpointMetadata::find_param(const std::string& name) const {
  for (const ParamRecord& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

const BufferRecord* CheckpointMetadata::find_buffer(const std::string& name) const {
  for (const BufferRecord& b : buffers)
    if (b.name == name) return &b;
  return nullptr;
}

std::string CheckpointMetadata::to_json() const {
  Json j;
  j["format"] = "fsdp.cpp checkpoint";
  j["version"] = version;
  j["step"] = step;
  j["progress"] = {{"consumed_samples", consumed_samples},
                   {"consumed_tokens", consumed_tokens}};
  j["rng"] = {{"kind", "counter-based"}, {"init_seed", init_seed}, {"data_seed", data_seed}};
  Json units_json = Json::array();
  for (const UnitRecord& u : units) {
    Json params_json = Json::array();
    for (const ParamPlacement& p : u.params)
      params_json.push_back({{"name", p.name}, {"shape", shape_json(p.shape)}, {"offset", p.offset},
                             {"weight_decay", p.weight_decay}});
    units_json.push_back({{"name", u.name}, {"experts", u.experts}, {"numel", u.numel},
                          {"padded_numel", u.padded_numel}, {"shard_numel", u.shard_numel},
                          {"params", params_json}});
  }
  j["layout"] = {{"strategy", strategy}, {"world_size", world_size}, {"shard_size", shard_size},
                 {"replicas", replicas}, {"tensor_parallel", tensor_parallel},
                 {"expert_parallel", expert_parallel}, {"expert_shard_size", expert_shard_size},
                 {"mesh", mesh}, {"plan_hash", hex64(plan_hash)},
                 {"shard_block", shard_block}, {"units", units_json}};
  j["state"] = {{"main_dtype", safetensors_dtype_name(main_dtype)},
                {"optimizer", optimizer},
                {"optimizer_steps", optimizer_steps},
                {"moments_dtype", moments_dtype ? Json(safetensors_dtype_name(*moments_dtype)) : Json()}};
  Json params_json = Json::object();
  for (const ParamRecord& p : params) {
    Json pieces = Json::array();
    for (const ParamPiece& piece : p.pieces)
      pieces.push_back({piece.file, piece.tensor_offset, piece.param_offset, piece.numel});
    params_json[p.name] = {{"shape", shape_json(p.shape)}, {"unit", p.unit}, {"pieces", pieces}};
    if (!p.tp_slices.empty()) params_json[p.name]["tp_slices"] = slices_json(p.tp_slices);
    if (!p.ep_slices.empty()) params_json[p.name]["ep_slices"] = slices_json(p.ep_slices);
  }
  j["parameters"] = params_json;
  Json buffers_json = Json::object();
  for (const BufferRecord& b : buffers)
    buffers_json[b.name] = {{"shape", shape_json(b.shape)}, {"file", b.file}};
  j["buffers"] = buffers_json;
  Json files_json = Json::array();
  for (const FileRecord& f : files) {
    Json tensors = Json::object();
    for (const TensorRecord& t : f.tensors)
      tensors[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)}, {"numel", t.numel},
                         {"sha256", t.sha256}};
    files_json.push_back({{"name", f.name}, {"shard_rank", f.shard_rank}, {"tp_rank", f.tp_rank},
                          {"ep_rank", f.ep_rank}, {"expert_shard_rank", f.expert_shard_rank},
                          {"bytes", f.bytes},
                          {"sha256", f.sha256}, {"tensors", tensors}});
  }
  j["files"] = files_json;
  j["recipe"] = Json::parse(recipe_json);
  // The metadata's own checksum: an edited offset or a flipped digit is caught before any
  // weight is read.
  j["metadata_sha256"] = sha256_hex(j.dump(1));
  return j.dump(1) + "\n";
}

CheckpointMetadata CheckpointMetadata::parse(const std::string& text, const std::string& source) {
  check_json_depth<CheckpointError>(text, source);
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    FSDP_THROW(CheckpointError, source, ": not valid JSON (", e.what(), ")");
  }
  const Fields f(source);
  CheckpointMetadata m;
  if (!j.is_object()) f.fail("", "expected a JSON object");
  if (f.text(f.member(j, "", "format"), "format") != "fsdp.cpp checkpoint")
    f.fail("format", "is not \"fsdp.cpp checkpoint\"");
  m.version = int(f.integer(f.member(j, "", "version"), "version"));
  if (m.version < 1 || m.version > kFormatVersion)
    f.fail("version", str_cat(m.version, " is not a version this build reads (1 to ", kFormatVersion, ")"));
  if (m.version >= 2) {
    const std::string recorded = f.text(f.member(j, "", "metadata_sha256"), "metadata_sha256");
    j.erase("metadata_sha256");
    if (sha256_hex(j.dump(1)) != recorded)
      f.fail("metadata_sha256", "does not match the metadata's text: the file was edited or damaged");
  }
  m.step = f.count(f.member(j, "", "step"), "step");

  const Json& progress = f.member(j, "", "progress");
  m.consumed_samples = f.count(f.member(progress, "progress", "consumed_samples"), "progress.consumed_samples");
  m.consumed_tokens = f.count(f.member(progress, "progress", "consumed_tokens"), "progress.consumed_tokens");
  // Checkpoints written before the position was counted in samples also hold
  // "data_position" (global micro-batches); consumed_samples says the same in samples.
  const Json& rng = f.member(j, "", "rng");
  m.init_seed = uint64_t(f.integer(f.member(rng, "rng", "init_seed"), "rng.init_seed"));
  m.data_seed = uint64_t(f.integer(f.member(rng, "rng", "data_seed"), "rng.data_seed"));

  const Json& layout = f.member(j, "", "layout");
  m.strategy = f.text(f.member(layout, "layout", "strategy"), "layout.strategy");
  m.world_size = int(f.count(f.member(layout, "layout", "world_size"), "layout.world_size"));
  m.shard_size = int(f.count(f.member(layout, "layout", "shard_size"), "layout.shard_size"));
  m.replicas = int(f.count(f.member(layout, "layout", "replicas"), "layout.replicas"));
  if (m.version >= 3) {
    m.tensor_parallel = int(f.count(f.member(layout, "layout", "tensor_parallel"), "layout.tensor_parallel"));
    if (m.tensor_parallel < 1) f.fail("layout.tensor_parallel", "must be at least 1");
  }
  if (m.version >= 4) {
    m.expert_parallel = int(f.count(f.member(layout, "layout", "expert_parallel"), "layout.expert_parallel"));
    if (m.expert_parallel < 1) f.fail("layout.expert_parallel", "must be at least 1");
    m.expert_shard_size =
        int(f.count(f.member(layout, "layout", "expert_shard_size"), "layout.expert_shard_size"));
    if (m.expert_shard_size < 1) f.fail("layout.expert_shard_size", "must be at least 1");
  }
  m.mesh = f.text(f.member(layout, "layout", "mesh"), "layout.mesh");
  const std::string hash = f.text(f.member(layout, "layout", "plan_hash"), "layout.plan_hash");
  try {
    size_t used = 0;
    m.plan_hash = std::stoull(hash, &used, 16);
    if (used != hash.size()) throw std::invalid_argument(hash);
  } catch (const std::exception&) {
    f.fail("layout.plan_hash", "expected hexadecimal digits");
  }
  m.shard_block = f.count(f.member(layout, "layout", "shard_block"), "layout.shard_block");
  const Json& units = f.array(f.member(layout, "layout", "units"), "layout.units");
  for (size_t i = 0; i < units.size(); ++i) {
    const std::string at = "layout.units[" + std::to_string(i) + "]";
    UnitRecord u;
    u.name = f.text(f.member(units[i], at, "name"), at + ".name");
    if (m.version >= 4) u.experts = f.boolean(f.member(units[i], at, "experts"), at + ".experts");
    u.numel = f.count(f.member(units[i], at, "numel"), at + ".numel");
    u.padded_numel = f.count(f.member(units[i], at, "padded_numel"), at + ".padded_numel");
    u.shard_numel = f.count(f.member(units[i], at, "shard_numel"), at + ".shard_numel");
    const Json& ps = f.array(f.member(units[i], at, "params"), at + ".params");
    for (size_t k = 0; k < ps.size(); ++k) {
      const std::string pat = at + ".params[" + std::to_string(k) + "]";
      ParamPlacement p;
      p.name = f.text(f.member(ps[k], pat, "name"), pat + ".name");
      p.shape = f.shape(f.member(ps[k], pat, "shape"), pat + ".shape");
      p.offset = f.count(f.member(ps[k], pat, "offset"), pat + ".offset");
      p.weight_decay = f.boolean(f.member(ps[k], pat, "weight_decay"), pat + ".weight_decay");
      p.numel = p.shape.numel();
      u.params.push_back(std::move(p));
    }
    m.units.push_back(std::move(u));
  }

  const Json& state = f.member(j, "", "state");
  m.main_dtype = f.dtype(f.member(state, "state", "main_dtype"), "state.main_dtype");
  m.optimizer = f.text(f.member(state, "state", "optimizer"), "state.optimizer");
  if (m.optimizer != "adamw" && m.optimizer != "muon" && m.optimizer != "sgd" && m.optimizer != "none")
    f.fail("state.optimizer", "expected adamw, muon, sgd or none, got \"" + m.optimizer + "\"");
  m.optimizer_steps = f.count(f.member(state, "state", "optimizer_steps"), "state.optimizer_steps");
  const Json& moments = f.member(state, "state", "moments_dtype");
  if (!moments.is_null()) m.moments_dtype = f.dtype(moments, "state.moments_dtype");
  if ((m.optimizer == "adamw" || m.optimizer == "muon") && !m.moments_dtype)
    f.fail("state.moments_dtype", "an " + m.optimizer + " checkpoint must hold its moments");

  const Json& files = f.array(f.member(j, "", "files"), "files");
  std::set<std::string> file_names;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string at = "files[" + std::to_string(i) + "]";
    FileRecord r;
    r.name = f.text(f.member(files[i], at, "name"), at + ".name");
    if (!is_plain_file_name(r.name)) f.fail(at + ".name", "\"" + r.name + "\" is not a plain file name");
    if (!file_names.insert(r.name).second) f.fail(at + ".name", "\"" + r.name + "\" is listed twice");
    r.shard_rank = int(f.count(f.member(files[i], at, "shard_rank"), at + ".shard_rank"));
    if (m.version >= 3) r.tp_rank = int(f.count(f.member(files[i], at, "tp_rank"), at + ".tp_rank"));
    if (m.version >= 4) {
      r.ep_rank = int(f.count(f.member(files[i], at, "ep_rank"), at + ".ep_rank"));
      r.expert_shard_rank =
          int(f.count(f.member(files[i], at, "expert_shard_rank"), at + ".expert_shard_rank"));
    }
    r.bytes = uint64_t(f.count(f.member(files[i], at, "bytes"), at + ".bytes"));
    r.sha256 = f.text(f.member(files[i], at, "sha256"), at + ".sha256");
    const Json& tensors = f.member(files[i], at, "tensors");
    if (!tensors.is_object()) f.fail(at + ".tensors", "expected an object");
    for (auto it = tensors.begin(); it != tensors.end(); ++it) {
      const std::string tat = at + ".tensors." + it.key();
      TensorRecord t;
      t.name = it.key();
      t.dtype = f.dtype(f.member(it.value(), tat, "dtype"), tat + ".dtype");
      t.numel = f.count(f.member(it.value(), tat, "numel"), tat + ".numel");
      t.sha256 = f.text(f.member(it.value(), tat, "sha256"), tat + ".sha256");
      r.tensors.push_back(std::move(t));
    }
    m.files.push_back(std::move(r));
  }

  const Json& params = f.member(j, "", "parameters");
  if (!params.is_object()) f.fail("parameters", "expected an object");
  for (auto it = params.begin(); it != params.end(); ++it) {
    const std::string at = "parameters." + it.key();
    ParamRecord p;
    p.name = it.key();
    p.shape = f.shape(f.member(it.value(), at, "shape"), at + ".shape");
    p.unit = f.text(f.member(it.value(), at, "unit"), at + ".unit");
    const Json& pieces = f.array(f.member(it.value(), at, "pieces"), at + ".pieces");
    for (size_t k = 0; k < pieces.size(); ++k) {
      const std::string pat = at + ".pieces[" + std::to_string(k) + "]";
      if (!pieces[k].is_array() || pieces[k].size() != 4)
        f.fail(pat, "expected [file, tensor_offset, param_offset, numel]");
      ParamPiece piece;
      const int64_t file = f.count(pieces[k][0], pat + "[0]");
      if (file >= int64_t(files.size()))
        f.fail(pat + "[0]", str_cat("file index ", file, " is not one of the ", files.size(), " files"));
      piece.file = int(file);
      piece.tensor_offset = f.count(pieces[k][1], pat + "[1]");
      piece.param_offset = f.count(pieces[k][2], pat + "[2]");
      piece.numel = f.count(pieces[k][3], pat + "[3]");
      p.pieces.push_back(piece);
    }
    if (it.value().contains("tp_slices"))
      p.tp_slices = parse_slices(it.value()["tp_slices"], p.shape, f, at + ".tp_slices");
    if (m.version >= 4 && it.value().contains("ep_slices"))
      p.ep_slices = parse_slices(it.value()["ep_slices"], p.shape, f, at + ".ep_slices");
    m.params.push_back(std::move(p));
  }
  if (m.version >= 4) {
    const Json& buffers = f.member(j, "", "buffers");
    if (!buffers.is_object()) f.fail("buffers", "expected an object");
    for (auto it = buffers.begin(); it != buffers.end(); ++it) {
      const std::string at = "buffers." + it.key();
      BufferRecord b;
      b.name = it.key();
      b.shape = f.shape(f.member(it.value(), at, "shape"), at + ".shape");
      const int64_t file = f.count(f.member(it.value(), at, "file"), at + ".file");
      if (file >= int64_t(files.size()))
        f.fail(at + ".file", str_cat("file index ", file, " is not one of the ", files.size(), " files"));
      b.file = int(file);
      m.buffers.push_back(std::move(b));
    }
  }
  m.recipe_json = f.member(j, "", "recipe").dump();
  check_files(m, f);
  check_pieces(m, f);
  check_buffers(m, f);
  return m;
}

std::string step_directory_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%06lld", static_cast<long long>(step));
  return buf;
}

int64_t step_of_directory_name(const std::string& name) {
  const std::string prefix = "step_";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (INT64_MAX - 9) / 10) return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::string shard_file_name(int index, int count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard_%05d_of_%05d.safetensors", index, count);
  return buf;
}

}  // namespace fsdp::checkpoint
