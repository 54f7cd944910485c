// Loading a recipe: JSON text -> schema-checked values -> overrides -> derived values ->
// range and consistency checks. Everything a key may be is read from recipe_schema().
#include "runtime/train/recipe.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/core/json_depth.h"
#include "runtime/train/recipe_checks.h"
#include "runtime/train/recipe_schema.h"
#include "runtime/train/recipe_suggest.h"

namespace fsdp::train {

using Json = nlohmann::ordered_json;

namespace {

template <typename... Fs> struct Overloaded : Fs... { using Fs::operator()...; };
template <typename... Fs> Overloaded(Fs...) -> Overloaded<Fs...>;

// A recipe is only ever read through this; the binder needs a non-const Recipe because the
// same binder is used to write.
FieldRef read_ref(const FieldSpec& spec, const Recipe& r) {
  return spec.bind(const_cast<Recipe&>(r));
}

bool is_string_field(const FieldSpec& spec, Recipe& scratch) {
  FieldRef ref = spec.bind(scratch);
  return std::holds_alternative<std::string*>(ref) ||
         std::holds_alternative<std::optional<std::string>*>(ref);
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// The value as a short quoted snippet for error messages.
std::string show(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// What the key accepts, in words, for "must be ..." messages.
std::string expected_of(const FieldSpec& spec, Recipe& scratch) {
  return std::visit(
      Overloaded{
          [](bool*) -> std::string { return "true or false"; },
          [](int*) -> std::string { return "an integer from -2147483648 to 2147483647"; },
          [](int64_t*) -> std::string { return "an integer"; },
          [](double*) -> std::string { return "a number"; },
          [&](auto* p) -> std::string {
            constexpr bool nullable =
                std::is_same_v<decltype(p), std::optional<std::string>*>;
            std::string what = "a string";
            if (!spec.choices.empty()) {
              std::vector<std::string> quoted;
              for (const auto& c : spec.choices) quoted.push_back("\"" + c + "\"");
              what = "one of " + join(quoted, ", ");
              if (spec.int_codes)
                what += " (or 0.." + std::to_string(spec.choices.size() - 1) + ")";
            }
            return nullable ? what + " or null" : what;
          },
      },
      spec.bind(scratch));
}

// An integer from a JSON number that holds one exactly (1000 or 1e3), else nullopt.
std::optional<int64_t> exact_integer(const Json& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return int64_t(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) return int64_t(d);
  }
  return std::nullopt;
}

Json default_json(const DefaultValue& d) {
  return std::visit(Overloaded{[](std::nullptr_t) { return Json(nullptr); },
                               [](const auto& v) { return Json(v); }},
                    d);
}

Json field_json(const FieldSpec& spec, const Recipe& r) {
  return std::visit(Overloaded{[](std::optional<std::string>* p) {
                                 return *p ? Json(**p) : Json(nullptr);
                               },
                               [](auto* p) { return Json(*p); }},
                    read_ref(spec, r));
}

// A string value for a key with choices: matched case-insensitively, stored canonically.
std::optional<std::string> match_choice(const FieldSpec& spec, const Json& v) {
  if (spec.choices.empty()) return v.is_string() ? std::optional(v.get<std::string>()) : std::nullopt;
  if (v.is_string()) {
    for (const auto& c : spec.choices)
      if (lower(c) == lower(v.get<std::string>())) return c;
  }
  if (spec.int_codes) {
    std::optional<int64_t> i = exact_integer(v);
    if (i && *i >= 0 && *i < int64_t(spec.choices.size())) return spec.choices[size_t(*i)];
  }
  return std::nullopt;
}

// Whether `s` is valid UTF-8 (no stray continuation bytes, no overlong forms, no surrogates,
// nothing past U+10FFFF): a recipe's strings are written back as JSON, which must be UTF-8.
bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    int len = 0;
    uint32_t cp = 0;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else return false;
    if (i + size_t(len) > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((p[i + size_t(k)] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + size_t(k)] & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += size_t(len);
  }
  return true;
}

// Stores JSON value `v` into the key, or throws ConfigError saying what it must be.
// `where` says where the value came from, for the message.
void assign(const FieldSpec& spec, const Json& v, Recipe& r, const std::string& where) {
  if (v.is_string())
    FSDP_CHECK(valid_utf8(v.get_ref<const std::string&>()), ConfigError, where, ": '", spec.path,
               "' is not valid UTF-8 text");
  auto bad = [&]() {
    FSDP_THROW(ConfigError, where, ": '", spec.path, "' must be ", expected_of(spec, r), ", got ",
               v.type_name(), " ", show(v));
  };
  std::visit(Overloaded{
                 [&](bool* p) {
                   if (!v.is_boolean()) bad();
                   *p = v.get<bool>();
                 },
                 [&](int* p) {
                   std::optional<int64_t> i = exact_integer(v);
                   if (!i || *i < std::numeric_limits<int>::min() ||
                       *i > std::numeric_limits<int>::max())
                     bad();
                   *p = int(*i);
                 },
                 [&](int64_t* p) {
                   std::optional<int64_t> i = exact_integer(v);
                   if (!i) bad();
                   *p = *i;
                 },
                 [&](double* p) {
                   if (!v.is_number()) bad();
                   *p = v.get<double>();
                 },
                 [&](std::string* p) {
                   std::optional<std::string> s = match_choice(spec, v);
                   if (!s) bad();
                   *p = *s;
                 },
                 [&](std::optional<std::string>* p) {
                   if (v.is_null()) {
                     *p = std::nullopt;
                     return;
                   }
                   std::optional<std::string> s = match_choice(spec, v);
                   if (!s) bad();
                   *p = *s;
                 },
             },
             spec.bind(r));
}

const FieldSpec* find_key(const std::string& path) {
  for (const FieldSpec& spec : recipe_schema())
    if (spec.path == path) return &spec;
  return nullptr;
}

bool is_section(const std::string& name) {
  for (const FieldSpec& spec : recipe_schema())
    if (spec.section() == name) return true;
  return false;
}

std::string unknown_key_message(const std::string& path, bool is_section_name) {
  std::string kind = is_section_name ? "section" : "key";
  std::optional<std::string> near =
      is_section_name ? suggest_section(path) : suggest_key(path);
  std::string msg = "unknown " + kind + " '" + path + "'";
  if (near) msg += " (did you mean '" + *near + "'?)";
  return msg;
}

// Sets every key to its schema default, derived keys still at their "derive me" value.
void apply_schema_defaults(Recipe& r) {
  for (const FieldSpec& spec : recipe_schema())
    assign(spec, default_json(spec.default_value), r, "schema default");
}

// Fills the keys whose default is derived from others (0 = derive).
void resolve_derived(Recipe& r) {
  ModelSection& m = r.model;
  if (m.n_kv_head == 0) m.n_kv_head = m.n_head;
  if (m.d_ff == 0) {
    if (m.family == "llama") {
      int64_t hidden = int64_t(2) * 4 * m.d_model / 3;
      m.d_ff = int((hidden + 255) / 256 * 256);
    } else {
      m.d_ff = 4 * m.d_model;
    }
  }
  if (m.padded_vocab_size == 0) m.padded_vocab_size = (m.vocab_size + 127) / 128 * 128;
  if (r.scheduler.lr_decay_iters == 0) r.scheduler.lr_decay_iters = r.train.train_iters;
}

// Parses JSON text; syntax errors and duplicate keys name the source, line and column.
Json parse_json_text(const std::string& text, const std::string& source) {
  // First the depth: the duplicate-key check below costs time in proportion to it per key.
  check_json_depth<ConfigError>(text, source);
  // Tracks the keys seen in each open object, to refuse duplicates (JSON parsers silently
  // keep the last one, which hides mistakes in long recipes).
  struct Frame {
    std::set<std::string> seen;
    std::string key;
  };
  std::vector<Frame> open;
  auto on_event = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (event == Json::parse_event_t::key && !open.empty()) {
      std::string key = parsed.get<std::string>();
      std::string path;
      for (size_t i = 0; i + 1 < open.size(); ++i) path += open[i].key + ".";
      FSDP_CHECK(open.back().seen.insert(key).second, ConfigError, source, ": key '", path + key,
                 "' appears twice");
      open.back().key = key;
    }
    return true;
  };
  try {
    return Json::parse(text, on_event);
  } catch (const Json::parse_error& e) {
    // e.byte counts the characters read, the offending one included.
    size_t end = std::min<size_t>(e.byte == 0 ? 0 : e.byte - 1, text.size());
    size_t line = 1, line_start = 0;
    for (size_t i = 0; i < end; ++i)
      if (text[i] == '\n') ++line, line_start = i + 1;
    size_t column = end - line_start + 1;
    std::string detail = e.what();
    size_t colon = detail.find(": ", detail.find("parse error"));
    if (colon != std::string::npos) detail = detail.substr(colon + 2);
    FSDP_THROW(ConfigError, source, ":", line, ":", column, ": invalid JSON: ", detail);
  } catch (const Json::exception& e) {
    // The rest carry no position: a number past a double's range, say.
    std::string detail = e.what();
    const size_t bracket = detail.find("] ");
    if (bracket != std::string::npos) detail = detail.substr(bracket + 2);
    FSDP_THROW(ConfigError, source, ": invalid JSON: ", detail);
  }
}

// Copies every key of the parsed file into `r`, refusing unknown sections and keys.
void apply_file(const Json& root, const std::string& source, Recipe& r,
                std::map<std::string, std::string>& origin) {
  FSDP_CHECK(root.is_object(), ConfigError, source, ": a recipe must be a JSON object of sections, got ",
             root.type_name());
  for (const auto& [section, body] : root.items()) {
    if (!body.is_object()) {
      // A top-level scalar is a key put outside its section ("lr": 1e-3).
      FSDP_CHECK(!is_section(section), ConfigError, source, ": section '", section,
                 "' must be an object of keys, got ", body.type_name(), " ", show(body));
      FSDP_THROW(ConfigError, source, ": ", unknown_key_message(section, false));
    }
    FSDP_CHECK(is_section(section), ConfigError, source, ": ", unknown_key_message(section, true));
    for (const auto& [key, value] : body.items()) {
      std::string path = section + "." + key;
      const FieldSpec* spec = find_key(path);
      FSDP_CHECK(spec, ConfigError, source, ": ", unknown_key_message(path, false));
      assign(*spec, value, r, source);
      origin[path] = source;
    }
  }
}

// Applies one "a.b=VALUE" override.
void apply_override(const std::string& text, Recipe& r, std::map<std::string, std::string>& origin) {
  std::string where = "override '" + text + "'";
  size_t eq = text.find('=');
  FSDP_CHECK(eq != std::string::npos && eq > 0, ConfigError, where,
             ": expected KEY=VALUE, e.g. optimizer.lr=3e-4");
  std::string path = text.substr(0, eq);
  std::string raw = text.substr(eq + 1);
  const FieldSpec* spec = find_key(path);
  if (!spec) {
    FSDP_CHECK(!is_section(path), ConfigError, where, ": '", path,
               "' is a section; set one of its keys, e.g. '", path, ".KEY=VALUE'");
    FSDP_THROW(ConfigError, where, ": ", unknown_key_message(path, false));
  }
  // VALUE is JSON when it parses as JSON, else a plain string. A string key given a number or
  // boolean (run.name=2024) takes the text as written, unless the number is a choice code.
  check_json_depth<ConfigError>(raw, "override of '" + path + "'");
  Json value = Json::parse(raw, nullptr, /*allow_exceptions=*/false);
  bool code = spec->int_codes && exact_integer(value).has_value();
  bool scalar = value.is_number() || value.is_boolean();
  if (value.is_discarded() || (is_string_field(*spec, r) && scalar && !code)) value = raw;
  assign(*spec, value, r, where);
  origin[path] = where;
}

std::string format_number(double v) {
  std::ostringstream os;
  os << std::setprecision(10) << v;
  return os.str();
}

// "in [0, 1)", ">= 1", "> 0", ... for a key with bounds; empty when unbounded.
std::string range_text(const FieldSpec& spec) {
  const bool has_low = spec.min || spec.above, has_high = spec.below || spec.max;
  if (has_low && has_high) {
    const std::string lo = spec.min ? "[" + format_number(*spec.min) : "(" + format_number(*spec.above);
    const std::string hi = spec.below ? format_number(*spec.below) + ")" : format_number(*spec.max) + "]";
    return "in " + lo + ", " + hi;
  }
  if (spec.min) return ">= " + format_number(*spec.min);
  if (spec.above) return "> " + format_number(*spec.above);
  if (spec.below) return "< " + format_number(*spec.below);
  if (spec.max) return "<= " + format_number(*spec.max);
  return "";
}

void check_ranges(const Recipe& r, const std::map<std::string, std::string>& origin) {
  for (const FieldSpec& spec : recipe_schema()) {
    Json v = field_json(spec, r);
    if (!v.is_number()) continue;
    double x = v.get<double>();
    bool ok = std::isfinite(x) && (!spec.min || x >= *spec.min) &&
              (!spec.above || x > *spec.above) && (!spec.below || x < *spec.below) &&
              (!spec.max || x <= *spec.max);
    if (ok) continue;
    auto it = origin.find(spec.path);
    std::string from = it == origin.end() ? "" : " (set in " + it->second + ")";
    FSDP_THROW(ConfigError, "'", spec.path, "' = ", v.dump(), " is out of range: must be ",
               range_text(spec).empty() ? "finite" : range_text(spec), from);
  }
}

Recipe build_recipe(const Json* root, const std::string& source,
                    const std::vector<std::string>& overrides) {
  Recipe r;  // fully resolved defaults; reset to the raw ones so derived keys derive again
  apply_schema_defaults(r);
  std::map<std::string, std::string> origin;
  if (root) apply_file(*root, source, r, origin);
  for (const std::string& o : overrides) apply_override(o, r, origin);
  check_ranges(r, origin);
  resolve_derived(r);
  check_consistency(r);
  return r;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  FSDP_CHECK(std::filesystem::exists(status), ConfigError, "recipe file '", path, "' does not exist");
  FSDP_CHECK(std::filesystem::is_regular_file(status), ConfigError, "recipe file '", path,
             "' is not a file (a directory?)");
  std::ifstream in(path, std::ios::binary);
  FSDP_CHECK(in, ConfigError, "cannot open recipe file '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  FSDP_CHECK(!in.bad(), IoError, "cannot read recipe file '", path, "'");
  return ss.str();
}

}  // namespace

Recipe::Recipe() {
  apply_schema_defaults(*this);
  resolve_derived(*this);
}

Recipe parse_recipe(const std::string& json_text, const std::vector<std::string>& overrides,
                    const std::string& source) {
  Json root = parse_json_text(json_text, source);
  return build_recipe(&root, source, overrides);
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_recipe(read_text_file(path), overrides, path);
}

std::string Recipe::to_json_string() const {
  Json root = Json::object();
  for (const FieldSpec& spec : recipe_schema())
    root[spec.section()][spec.leaf()] = field_json(spec, *this);
  return root.dump(2) + "\n";
}

void Recipe::write_resolved(const std::string& path) const {
  // Written beside and renamed over: an earlier file stays whole if this write fails, and a
  // failed write takes its partial file back and says why (a full disk, a file-size limit).
  const std::string tmp = path + ".tmp";
  const std::string text = to_json_string();
  errno = 0;
  FILE* f = std::fopen(tmp.c_str(), "wb");
  FSDP_CHECK(f != nullptr, IoError, "cannot create '", tmp, "' for the resolved recipe: ",
             std::strerror(errno));
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size() &&
                     std::fflush(f) == 0;
  const int write_error = errno;
  const bool closed = std::fclose(f) == 0;
  const int why = wrote ? errno : write_error;
  if (!wrote || !closed) {
    std::remove(tmp.c_str());
    FSDP_THROW(IoError, "cannot write the resolved recipe to '", tmp, "': ",
               why ? std::strerror(why) : "unknown error", " (nothing was left there)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::remove(tmp.c_str());
  FSDP_CHECK(!ec, IoError, "cannot replace '", path, "': ", ec.message());
}

std::string Recipe::summary() const {
  size_t width = 0;
  for (const FieldSpec& spec : recipe_schema()) width = std::max(width, spec.leaf().size());
  std::ostringstream os;
  std::string section;
  for (const FieldSpec& spec : recipe_schema()) {
    if (spec.section() != section) {
      section = spec.section();
      os << section << ":\n";
    }
    Json v = field_json(spec, *this);
    os << "  " << std::left << std::setw(int(width)) << spec.leaf() << "  "
       << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
  }
  return os.str();
}

std::string recipe_help_text() {
  Recipe scratch;
  size_t width = 0;
  for (const FieldSpec& spec : recipe_schema()) width = std::max(width, spec.path.size());
  std::ostringstream os;
  os << "Recipe keys: set them in the JSON file's sections, or override any with KEY=VALUE\n"
        "(VALUE is read as JSON when it parses, else as a string; KEY=null clears a nullable key).\n";
  std::string section;
  for (const FieldSpec& spec : recipe_schema()) {
    if (spec.section() != section) {
      section = spec.section();
      os << "\n" << section << "\n";
    }
    std::string type = expected_of(spec, scratch);
    std::string range = range_text(spec);
    if (!range.empty()) type += ", " + range;
    os << "  " << std::left << std::setw(int(width)) << spec.path << "  "
       << default_json(spec.default_value).dump() << "  (" << type << ")\n"
       << "      " << spec.help << "\n";
  }
  return os.str();
}

void Recipe::resolve_device(bool cuda_available) {
  if (dist.device == "auto") dist.device = cuda_available ? "cuda" : "cpu";
  FSDP_CHECK(dist.device != "cuda" || cuda_available, ConfigError,
             "'dist.device' is \"cuda\" but no CUDA device is available (use \"cpu\" or \"auto\")");
  FSDP_CHECK(!train.cuda_graphs || dist.device == "cuda", ConfigError,
             "'train.cuda_graphs' is true but 'dist.device' is \"", dist.device, "\"",
             cuda_available ? "" : " (no CUDA device is visible)",
             ": CUDA graphs need a GPU (set train.cuda_graphs=false)");
  if (dist.backend == "auto") dist.backend = dist.device == "cuda" ? "nccl" : "mpi";
  FSDP_CHECK(!(dist.backend == "nccl" && dist.device == "cpu"), ConfigError,
             "'dist.backend' is \"nccl\" but 'dist.device' is \"cpu\": NCCL moves GPU buffers "
             "(use \"mpi\" on the CPU)");
  FSDP_CHECK(!(dist.backend == "mpi" && dist.device == "cuda"), ConfigError,
             "'dist.backend' is \"mpi\" but 'dist.device' is \"cuda\": the MPI backend moves "
             "host buffers (use \"nccl\", one GPU per rank, or \"staged\", which lets ranks "
             "share a GPU)");
  // The staged backend stages the buffers of the device it finds (a GPU where one is visible).
  FSDP_CHECK(!(dist.backend == "staged" && dist.device == "cpu" && cuda_available), ConfigError,
             "'dist.backend' is \"staged\" but 'dist.device' is \"cpu\" on a machine with a "
             "GPU: the staged backend would run on the GPU (use \"mpi\" for CPU ranks)");
  FSDP_CHECK(!(train.cuda_graphs && dist.backend == "staged"), ConfigError,
             "'train.cuda_graphs' is true but 'dist.backend' is \"staged\": its collectives "
             "wait for a host thread, which a graph replay would not run (set "
             "train.cuda_graphs=false)");
  MixedPrecisionSection& mp = mixed_precision;
  if (mp.compute_dtype == "auto") mp.compute_dtype = dist.device == "cuda" ? "bf16" : "f32";
  FSDP_CHECK(!(mp.compute_dtype == "bf16" && dist.device == "cpu"), ConfigError,
             "'mixed_precision.compute_dtype' is \"bf16\" but 'dist.device' is \"cpu\"",
             cuda_available ? "" : " (no CUDA device is visible)",
             ": the CPU kernels compute in f32 or f64 (use \"f32\", \"f64\" or \"auto\", or "
             "dist.device=cuda on a GPU)");
  if (mp.grad_reduce_dtype == "auto") {
    if (dist.device == "cpu" && mp.compute_dtype == "f32") {
      // f32 gradients summed in f64 are exact: any sharding and data-parallel size then
      // gives a single process's results bit for bit (see runtime/fsdp/sharded_model.h).
      mp.grad_reduce_dtype = "f64";
    } else {
      bool wide = ddp.grad_reduce_in_fp32 && mp.compute_dtype != "f64";
      mp.grad_reduce_dtype = wide ? "f32" : mp.compute_dtype;
    }
  }
}

void Recipe::resolve_world(int world_size) {
  FSDP_CHECK(world_size >= 1, ConfigError, "world size must be >= 1, got ", world_size);
  const int tp = model.tensor_model_parallel_size, cp = model.context_parallel_size;
  const int ep = model.expert_model_parallel_size;
  const int64_t fixed = int64_t(dist.dp_outer) * tp * cp * ep;
  const std::string fixed_keys =
      str_cat("dist.dp_outer (", dist.dp_outer, ") * model.tensor_model_parallel_size (", tp,
              ") * model.context_parallel_size (", cp, ")",
              ep > 1 ? str_cat(" * model.expert_model_parallel_size (", ep, ")") : std::string());
  if (dist.dp_shard == -1) {
    FSDP_CHECK(world_size % fixed == 0, ConfigError, "world size ", world_size,
               " is not divisible by ", fixed_keys, " = ", fixed);
    dist.dp_shard = int(world_size / fixed);
  }
  FSDP_CHECK(fixed * dist.dp_shard == world_size, ConfigError, fixed_keys, " * dist.dp_shard (",
             dist.dp_shard, ") = ", fixed * dist.dp_shard, " does not match the world size ",
             world_size);
  // Expert-parallel ranks take data of their own (collectives/mesh.h).
  validate_world(dist.dp_outer * dist.dp_shard * ep);
}

void Recipe::validate_world(int dp_size) const {
  FSDP_CHECK(dp_size >= 1, ConfigError, "data-parallel size must be >= 1, got ", dp_size);
  int64_t per_step = int64_t(train.micro_batch_size) * dp_size;
  FSDP_CHECK(train.global_batch_size == 0 || train.global_batch_size % per_step == 0,
             ConfigError, "'train.global_batch_size' (", train.global_batch_size,
             ") must be a multiple of 'train.micro_batch_size' (", train.micro_batch_size,
             ") * data-parallel size (", dp_size, ") = ", per_step);
}

int64_t Recipe::grad_accum_steps(int dp_size) const {
  validate_world(dp_size);
  if (train.global_batch_size == 0) return 1;
  return train.global_batch_size / (int64_t(train.micro_batch_size) * dp_size);
}

std::string first_difference(const Recipe& a, const Recipe& b,
                             const std::vector<std::string>& ignore) {
  for (const FieldSpec& spec : recipe_schema()) {
    if (std::find(ignore.begin(), ignore.end(), spec.path) != ignore.end()) continue;
    const Json va = field_json(spec, a), vb = field_json(spec, b);
    if (va != vb) return str_cat(spec.path, " (", show(va), " vs ", show(vb), ")");
  }
  return "";
}

}  // namespace fsdp::train
