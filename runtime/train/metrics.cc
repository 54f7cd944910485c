#include "runtime/train/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <limits>

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/core/json_depth.h"

namespace fsdp::train {

using Json = nlohmann::ordered_json;

namespace {

Json number(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

double read_number(const Json& obj, const char* key) {
  auto it = obj.find(key);
  FSDP_CHECK(it != obj.end(), DataError, "metrics record has no '", key, "'");
  if (it->is_null()) return std::numeric_limits<double>::quiet_NaN();
  FSDP_CHECK(it->is_number(), DataError, "metrics field '", key, "' is not a number");
  return it->get<double>();
}

std::optional<double> read_optional(const Json& obj, const char* key) {
  if (!obj.contains(key)) return std::nullopt;
  return read_number(obj, key);
}

void make_parent_dirs(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  FSDP_CHECK(!ec, IoError, "cannot create directory '", parent.string(), "': ", ec.message());
}

// The lines of `path` worth keeping on resume: whole records of steps <= last_step.
std::vector<std::string> lines_through_step(const std::string& path, int64_t last_step) {
  std::vector<std::string> kept;
  std::ifstream in(path);
  if (!in) return kept;  // nothing logged yet
  std::string line;
  while (std::getline(in, line)) {
    if (json_too_deep(line)) continue;  // not a record of ours
    Json obj = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (obj.is_discarded() || !obj.is_object() || !obj.contains("step")) continue;  // torn line
    if (obj["step"].is_number_integer() && obj["step"].get<int64_t>() <= last_step)
      kept.push_back(line);
  }
  return kept;
}

}  // namespace

std::string metrics_json_line(const StepMetrics& m) {
  Json obj;
  obj["step"] = m.step;
  obj["loss"] = number(m.loss);
  obj["lr"] = number(m.lr);
  obj["grad_norm"] = number(m.grad_norm);
  obj["tokens_per_sec"] = number(m.tokens_per_sec);
  obj["step_time_s"] = number(m.step_time_s);
  obj["mem_peak_bytes"] = m.mem_peak_bytes;
  if (m.val_loss) obj["val_loss"] = number(*m.val_loss);
  if (m.tflops) obj["tflops"] = number(*m.tflops);
  if (m.mfu) obj["mfu"] = number(*m.mfu);
  if (m.moe_aux_loss) obj["moe_aux_loss"] = number(*m.moe_aux_loss);
  if (m.moe_z_loss) obj["moe_z_loss"] = number(*m.moe_z_loss);
  if (m.moe_max_load) obj["moe_max_load"] = number(*m.moe_max_load);
  if (!m.moe_expert_tokens.empty()) obj["moe_expert_tokens"] = m.moe_expert_tokens;
  if (!m.update_norms.empty()) {
    Json norms = Json::object();
    for (const auto& [group, norm] : m.update_norms) norms[group] = number(norm);
    obj["update_norms"] = norms;
  }
  return obj.dump();
}

StepMetrics parse_metrics_line(const std::string& line) {
  FSDP_CHECK(!json_too_deep(line), DataError, "metrics line nests deeper than ", kMaxJsonDepth,
             " levels");
  Json obj = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  FSDP_CHECK(!obj.is_discarded() && obj.is_object(), DataError,
             "metrics line is not a JSON object");
  FSDP_CHECK(obj.contains("step") && obj["step"].is_number_integer(), DataError,
             "metrics record has no integer 'step'");
  StepMetrics m;
  m.step = obj["step"].get<int64_t>();
  m.loss = read_number(obj, "loss");
  m.lr = read_number(obj, "lr");
  m.grad_norm = read_number(obj, "grad_norm");
  m.tokens_per_sec = read_number(obj, "tokens_per_sec");
  m.step_time_s = read_number(obj, "step_time_s");
  double mem = read_number(obj, "mem_peak_bytes");
  m.mem_peak_bytes = std::isfinite(mem) ? int64_t(mem) : 0;
  m.val_loss = read_optional(obj, "val_loss");
  m.tflops = read_optional(obj, "tflops");
  m.mfu = read_optional(obj, "mfu");
  m.moe_aux_loss = read_optional(obj, "moe_aux_loss");
  m.moe_z_loss = read_optional(obj, "moe_z_loss");
  m.moe_max_load = read_optional(obj, "moe_max_load");
  if (obj.contains("moe_expert_tokens")) {
    auto integers = [](const Json& row) {
      return row.is_array() && std::all_of(row.begin(), row.end(),
                                           [](const Json& c) { return c.is_number_integer(); });
    };
    const Json& layers = obj["moe_expert_tokens"];
    FSDP_CHECK(layers.is_array() && std::all_of(layers.begin(), layers.end(), integers),
               DataError, "metrics field 'moe_expert_tokens' is not a list of lists of integers");
    for (const Json& row : layers) m.moe_expert_tokens.push_back(row.get<std::vector<int64_t>>());
  }
  if (obj.contains("update_norms")) {
    const Json& norms = obj["update_norms"];
    FSDP_CHECK(norms.is_object(), DataError, "metrics field 'update_norms' is not an object");
    for (auto it = norms.begin(); it != norms.end(); ++it)
      m.update_norms[it.key()] = read_number(norms, it.key().c_str());
  }
  return m;
}

StepLogWriter::StepLogWriter(const std::string& path, std::optional<int64_t> resume_step)
    : path_(path) {
  make_parent_dirs(path);
  if (resume_step) {
    // Rewrite the kept lines through a temporary file, so a crash here loses nothing.
    std::vector<std::string> kept = lines_through_step(path, *resume_step);
    std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      for (const std::string& line : kept) out << line << '\n';
      out.flush();
      FSDP_CHECK(out, IoError, "cannot write '", tmp, "'");
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    FSDP_CHECK(!ec, IoError, "cannot replace '", path, "': ", ec.message());
  }
  out_.open(path, resume_step ? std::ios::app : std::ios::trunc);
  FSDP_CHECK(out_, IoError, "cannot open '", path, "' for writing");
}

void StepLogWriter::write_line(const std::string& json_line) {
  out_ << json_line << '\n';
  out_.flush();  // a killed run keeps every line it logged
  FSDP_CHECK(out_, IoError, "cannot write to '", path_, "'");
}

std::vector<StepMetrics> read_metrics_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FSDP_CHECK(in, IoError, "cannot open metrics file '", path, "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  FSDP_CHECK(!in.bad(), IoError, "cannot read metrics file '", path, "'");
  std::vector<StepMetrics> records;
  size_t start = 0;
  for (size_t line_no = 1; start < text.size(); ++line_no) {
    size_t end = text.find('\n', start);
    bool last_unterminated = end == std::string::npos;
    std::string line = text.substr(start, last_unterminated ? std::string::npos : end - start);
    start = last_unterminated ? text.size() : end + 1;
    if (line.empty()) continue;
    try {
      records.push_back(parse_metrics_line(line));
    } catch (const DataError& e) {
      if (last_unterminated) break;  // a run killed in the middle of writing this line
      FSDP_THROW(DataError, path, ":", line_no, ": ", e.what());
    }
  }
  return records;
}

double flops_per_token(int64_t n_params, int n_layer, int d_model, int seq_length) {
  return 6.0 * double(n_params) + 12.0 * double(n_layer) * double(d_model) * double(seq_length);
}

double model_flops_utilization(double tokens_per_sec, double flops_per_token, double peak_flops) {
  FSDP_CHECK(peak_flops > 0, ValueError, "peak FLOP/s must be positive, got ", peak_flops);
  return tokens_per_sec * flops_per_token / peak_flops;
}

}  // namespace fsdp::train
