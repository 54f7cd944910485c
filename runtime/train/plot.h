// The loss picture: an SVG line chart of training loss (and validation loss points) against
// step, drawn by our own code so a run can leave it behind with no plotting tools around.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/train/metrics.h"

namespace fsdp::train {

struct LossPoint {
  int64_t step = 0;
  double loss = 0;
};

struct LossSeries {
  std::vector<LossPoint> train;
  std::vector<LossPoint> val;
};

// The train and validation losses of metrics records, in record order.
LossSeries loss_series(const std::vector<StepMetrics>& records);

// A complete SVG document: axes with ticks and labels, a title, a polyline through every
// finite train point (non-finite ones are left out) and a marker per finite val point.
std::string loss_chart_svg(const LossSeries& series, const std::string& title);

// Writes loss_chart_svg() to `path`. Throws IoError.
void write_loss_chart(const std::string& path, const LossSeries& series, const std::string& title);

}  // namespace fsdp::train
