// Run metrics: one record per logged step, appended as a JSON line to metrics.jsonl so that
// tools can parse a run while it trains and a killed run keeps what it logged. Also the
// FLOP and MFU arithmetic the step line reports.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::train {

struct StepMetrics {
  int64_t step = 0;                  // optimizer steps completed (1-based)
  double loss = 0;                   // mean training loss of this step
  double lr = 0;
  double grad_norm = 0;              // global norm before clipping
  double tokens_per_sec = 0;         // over all ranks
  double step_time_s = 0;
  int64_t mem_peak_bytes = 0;        // this rank's device memory peak
  std::optional<double> val_loss;    // when validation ran at this step
  std::optional<double> tflops;      // achieved model TFLOP/s per device
  std::optional<double> mfu;         // model FLOPs utilization, a fraction of peak
  // Mixture-of-experts models only. The auxiliary losses without their coefficients, summed
  // over the MoE layers, per micro-batch (averaged over the step's micro-batches and ranks);
  // the load: the most tokens any expert got over the mean per expert, the largest over the
  // MoE layers, counted over the step's global batch (1 = perfectly balanced).
  std::optional<double> moe_aux_loss;
  std::optional<double> moe_z_loss;
  std::optional<double> moe_max_load;
  // logger.log_expert_tokens: tokens per expert over the global batch, one list per MoE
  // layer (empty: off).
  std::vector<std::vector<int64_t>> moe_expert_tokens;
  // mixed_precision.fp8: how many linear layers run their products in FP8 (the step line
  // shows it; not written to metrics.jsonl, it does not change within a run).
  std::optional<int64_t> fp8_layers;
  // logger.log_update_norms: ||new - old master weights|| per tensor group (empty: off).
  std::map<std::string, double> update_norms;
};

// The JSON object of one record, on one line (no newline). Non-finite numbers are written
// as null, since JSON has no NaN.
std::string metrics_json_line(const StepMetrics& m);
// Parses one line written by metrics_json_line (null numbers read back as NaN). Throws
// DataError naming what is missing or malformed.
StepMetrics parse_metrics_line(const std::string& line);

// Appends one JSON line per step to a file (metrics.jsonl, the samples log), flushed as
// each is written.
class StepLogWriter {
 public:
  // A fresh run (no resume_step) truncates `path`. A run resumed after step k keeps the lines
  // of steps <= k, drops later ones (they will be trained again) and a torn last line, and
  // appends after them. Creates missing parent directories. Throws IoError.
  explicit StepLogWriter(const std::string& path,
                         std::optional<int64_t> resume_step = std::nullopt);

  StepLogWriter(const StepLogWriter&) = delete;
  StepLogWriter& operator=(const StepLogWriter&) = delete;

  void write(const StepMetrics& m) { write_line(metrics_json_line(m)); }
  // One JSON object with an integer "step" member, without the newline.
  void write_line(const std::string& json_line);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

// Every record of a metrics file, in file order. Throws IoError if it cannot be read and
// DataError naming the file and line for a malformed line (a torn last line is skipped).
std::vector<StepMetrics> read_metrics_file(const std::string& path);

// Peak dense bf16 tensor-core throughput of one H200 (and H100 SXM), FLOP/s.
constexpr double kH200PeakBf16Flops = 989e12;

// Training FLOPs per token of a decoder-only transformer (PaLM's estimate):
// 6 * n_params for the weight matmuls forward and backward, plus 12 * n_layer * d_model *
// seq_length for attention scores and values.
double flops_per_token(int64_t n_params, int n_layer, int d_model, int seq_length);
// Achieved fraction of `peak_flops` (per device: pass per-device tokens/s).
double model_flops_utilization(double tokens_per_sec, double flops_per_token, double peak_flops);

}  // namespace fsdp::train
