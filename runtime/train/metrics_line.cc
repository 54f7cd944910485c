#include "runtime/train/metrics_line.h"

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>

#include <unistd.h>

namespace fsdp::train {
namespace {

const char* const kBold = "\033[1m";
const char* const kDim = "\033[2m";
const char* const kRed = "\033[31m";
const char* const kCyan = "\033[36m";
const char* const kReset = "\033[0m";

std::string printf_string(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

// Pads `text` on the left to `width` characters (used only on terminals).
std::string pad_left(const std::string& text, size_t width) {
  return text.size() >= width ? text : std::string(width - text.size(), ' ') + text;
}

// Builds the line field by field, so plain and terminal output share one order.
class LineBuilder {
 public:
  explicit LineBuilder(bool terminal) : terminal_(terminal) {}

  // label, value, unit: "loss 5.4321", "12.3k tok/s". `width` pads the value on terminals.
  void field(const std::string& label, const std::string& value, const std::string& unit,
             size_t width, const char* color = nullptr) {
    std::string out;
    if (!parts_.empty()) out += terminal_ ? std::string(kDim) + " | " + kReset : " | ";
    if (!label.empty()) out += label + " ";
    std::string shown = terminal_ ? pad_left(value, width) : value;
    if (terminal_ && color) shown = color + shown + kReset;
    out += shown;
    if (!unit.empty()) out += " " + unit;
    parts_.push_back(out);
  }

  std::string str() const {
    std::string s;
    for (const std::string& p : parts_) s += p;
    return s;
  }

 private:
  bool terminal_;
  std::vector<std::string> parts_;
};

}  // namespace

bool stdout_is_terminal() {
  // Under mpirun every rank's stdout is a pseudo-terminal whatever the real destination
  // (often a log file), so a launched rank prints plain lines.
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
                        std::getenv("SLURM_PROCID");
  return !launched && isatty(STDOUT_FILENO) == 1;
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024.0 && u < 4) v /= 1024.0, ++u;
  if (u == 0) return std::to_string(bytes) + " B";
  return printf_string(v < 10 ? "%.2f" : v < 100 ? "%.1f" : "%.0f", v) + " " + units[u];
}

std::string format_count(double value) {
  const char* prefixes[] = {"", "k", "M", "G", "T"};
  int p = 0;
  while (std::fabs(value) >= 1000.0 && p < 4) value /= 1000.0, ++p;
  if (p == 0) return printf_string("%.0f", value);
  return printf_string(std::fabs(value) < 10 ? "%.2f" : std::fabs(value) < 100 ? "%.1f" : "%.0f",
                       value) + prefixes[p];
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = int64_t(std::llround(seconds));
  char buf[48];
  if (s < 60) std::snprintf(buf, sizeof(buf), "%llds", (long long)s);
  else if (s < 3600) std::snprintf(buf, sizeof(buf), "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else if (s < 86400) std::snprintf(buf, sizeof(buf), "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  else std::snprintf(buf, sizeof(buf), "%lldd%02lldh", (long long)(s / 86400), (long long)(s % 86400 / 3600));
  return buf;
}

std::string format_step_line(const StepMetrics& m, int64_t total_steps, bool terminal,
                             const std::optional<RunClock>& clock) {
  LineBuilder line(terminal);
  std::string total = std::to_string(total_steps);
  std::string step = terminal ? pad_left(std::to_string(m.step), total.size())
                              : std::to_string(m.step);
  line.field("step", step + "/" + total, "", 0);
  const char* loss_color = std::isfinite(m.loss) ? kBold : kRed;
  line.field("loss", printf_string("%.4f", m.loss), "", 8, loss_color);
  if (m.val_loss) line.field("val", printf_string("%.4f", *m.val_loss), "", 8, kCyan);
  line.field("lr", printf_string("%.3e", m.lr), "", 9);
  line.field("grad norm", printf_string("%.3f", m.grad_norm), "", 7,
             std::isfinite(m.grad_norm) ? nullptr : kRed);
  if (m.moe_aux_loss) line.field("aux", printf_string("%.4f", *m.moe_aux_loss), "", 7);
  if (m.moe_z_loss) line.field("z", printf_string("%.4f", *m.moe_z_loss), "", 7);
  if (m.moe_max_load) line.field("max load", printf_string("%.2f", *m.moe_max_load), "", 5);
  line.field("", format_count(m.tokens_per_sec), "tok/s", 6);
  if (m.fp8_layers) line.field("fp8", std::to_string(*m.fp8_layers), "layers", 3);
  if (m.tflops) line.field("", printf_string("%.1f", *m.tflops), "TFLOP/s", 6);
  if (m.mfu) line.field("MFU", printf_string("%.1f", 100.0 * *m.mfu) + "%", "", 6);
  line.field("mem", format_bytes(m.mem_peak_bytes), "", 10);
  line.field("", printf_string("%.1f", 1000.0 * m.step_time_s), "ms", 7);
  if (clock) {
    line.field("", format_duration(clock->elapsed_s), "elapsed", 6);
    if (clock->eta_s) line.field("eta", format_duration(*clock->eta_s), "", 6);
  }
  return line.str();
}

}  // namespace fsdp::train
