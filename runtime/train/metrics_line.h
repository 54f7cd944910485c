// The human step line rank 0 prints every log_interval steps, e.g.
//   step 10/200 | loss 5.4321 | lr 1.000e-03 | grad norm 1.234 | 12.3k tok/s | mem 1.2 GiB | 95.1 ms
//     | 1s elapsed | eta 18s
// Plain when stdout is not a terminal (logs, pipes); column-aligned and colored when it is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/train/metrics.h"

namespace fsdp::train {

// Whether standard output is an interactive terminal.
bool stdout_is_terminal();

// Wall time of the run so far and the estimated time left, for the end of the step line.
struct RunClock {
  double elapsed_s = 0;
  std::optional<double> eta_s;  // unknown before a step was timed, and after the last
};

// One line (no newline) for step m.step of total_steps. TFLOP/s, MFU and val loss appear
// only when set; the elapsed time and the time left when `clock` is given. `terminal` pads
// every field to a fixed width and adds ANSI colors.
std::string format_step_line(const StepMetrics& m, int64_t total_steps, bool terminal,
                             const std::optional<RunClock>& clock = std::nullopt);

// A duration for people: "42s", "7m05s", "3h12m", "2d04h".
std::string format_duration(double seconds);

// "512 B", "1.5 KiB", "3.25 GiB".
std::string format_bytes(int64_t bytes);
// "950", "12.3k", "4.56M" (decimal prefixes, for rates).
std::string format_count(double value);

}  // namespace fsdp::train
