#include "runtime/train/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "runtime/core/error.h"

namespace fsdp::train {
namespace {

// Canvas and plot-area geometry, in SVG user units.
constexpr double kWidth = 800, kHeight = 480;
constexpr double kLeft = 72, kRight = 24, kTop = 48, kBottom = 56;
constexpr int kTargetTicks = 6;
const char* const kTrainColor = "#1f77b4";
const char* const kValColor = "#ff7f0e";

// An axis from lo to hi with ticks every `step`, lo and hi on tick marks.
struct Axis {
  double lo = 0, hi = 1, step = 0.2;
};

// 1, 2 or 5 times a power of ten, near range / kTargetTicks.
double nice_step(double range) {
  double raw = range / kTargetTicks;
  double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double fraction = raw / magnitude;
  double nice = fraction < 1.5 ? 1 : fraction < 3.5 ? 2 : fraction < 7.5 ? 5 : 10;
  return nice * magnitude;
}

Axis make_axis(double lo, double hi) {
  if (!(hi > lo)) {  // one value (or none): give it room on both sides
    double pad = std::fabs(lo) > 0 ? std::fabs(lo) * 0.1 : 1.0;
    lo -= pad, hi += pad;
  }
  Axis a;
  a.step = nice_step(hi - lo);
  a.lo = std::floor(lo / a.step) * a.step;
  a.hi = std::ceil(hi / a.step) * a.step;
  return a;
}

// The tick positions lo, lo + step, ..., hi (computed by index: no drift from summing).
std::vector<double> ticks(const Axis& a) {
  std::vector<double> out;
  int n = int(std::lround((a.hi - a.lo) / a.step));
  for (int i = 0; i <= n; ++i) out.push_back(a.lo + i * a.step);
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

std::string tick_label(double v, double step) {
  if (std::fabs(v) < step * 1e-9) v = 0;  // no "-0" or "1e-17" at the origin
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// Maps data coordinates into the plot area.
struct Frame {
  Axis x, y;
  double px(double step) const {
    return kLeft + (step - x.lo) / (x.hi - x.lo) * (kWidth - kLeft - kRight);
  }
  double py(double loss) const {
    return kHeight - kBottom - (loss - y.lo) / (y.hi - y.lo) * (kHeight - kTop - kBottom);
  }
};

Frame frame_for(const LossSeries& s) {
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  for (const auto* points : {&s.train, &s.val}) {
    for (const LossPoint& p : *points) {
      if (!std::isfinite(p.loss)) continue;
      xlo = std::min(xlo, double(p.step)), xhi = std::max(xhi, double(p.step));
      ylo = std::min(ylo, p.loss), yhi = std::max(yhi, p.loss);
    }
  }
  if (!std::isfinite(xlo)) xlo = 0, xhi = 1, ylo = 0, yhi = 1;  // nothing finite to draw
  Frame f;
  f.x = make_axis(std::min(xlo, 0.0), xhi);  // steps start at the origin
  f.y = make_axis(ylo, yhi);
  return f;
}

void draw_axes(std::ostringstream& os, const Frame& f) {
  const std::vector<double> xs = ticks(f.x), ys = ticks(f.y);
  double left = kLeft, right = kWidth - kRight, top = kTop, bottom = kHeight - kBottom;
  os << "<g stroke=\"#dddddd\" stroke-width=\"1\">\n";
  for (double v : xs)
    os << "<line x1=\"" << num(f.px(v)) << "\" y1=\"" << num(top) << "\" x2=\"" << num(f.px(v))
       << "\" y2=\"" << num(bottom) << "\"/>\n";
  for (double v : ys)
    os << "<line x1=\"" << num(left) << "\" y1=\"" << num(f.py(v)) << "\" x2=\"" << num(right)
       << "\" y2=\"" << num(f.py(v)) << "\"/>\n";
  os << "</g>\n";
  os << "<g stroke=\"#333333\" stroke-width=\"1\">\n"
     << "<line x1=\"" << num(left) << "\" y1=\"" << num(bottom) << "\" x2=\"" << num(right)
     << "\" y2=\"" << num(bottom) << "\"/>\n"
     << "<line x1=\"" << num(left) << "\" y1=\"" << num(top) << "\" x2=\"" << num(left)
     << "\" y2=\"" << num(bottom) << "\"/>\n";
  for (double v : xs)
    os << "<line x1=\"" << num(f.px(v)) << "\" y1=\"" << num(bottom) << "\" x2=\"" << num(f.px(v))
       << "\" y2=\"" << num(bottom + 5) << "\"/>\n";
  for (double v : ys)
    os << "<line x1=\"" << num(left - 5) << "\" y1=\"" << num(f.py(v)) << "\" x2=\"" << num(left)
       << "\" y2=\"" << num(f.py(v)) << "\"/>\n";
  os << "</g>\n";
  os << "<g fill=\"#333333\">\n";
  for (double v : xs)
    os << "<text x=\"" << num(f.px(v)) << "\" y=\"" << num(bottom + 20)
       << "\" text-anchor=\"middle\">" << tick_label(v, f.x.step) << "</text>\n";
  for (double v : ys)
    os << "<text x=\"" << num(left - 9) << "\" y=\"" << num(f.py(v) + 4)
       << "\" text-anchor=\"end\">" << tick_label(v, f.y.step) << "</text>\n";
  os << "<text x=\"" << num((left + right) / 2) << "\" y=\"" << num(kHeight - 14)
     << "\" text-anchor=\"middle\">step</text>\n"
     << "<text x=\"18\" y=\"" << num((top + bottom) / 2) << "\" text-anchor=\"middle\" "
     << "transform=\"rotate(-90 18 " << num((top + bottom) / 2) << ")\">loss</text>\n"
     << "</g>\n";
}

void draw_legend(std::ostringstream& os, bool with_val) {
  double x = kWidth - kRight - 130, y = kTop + 14;
  // A white card under the legend keeps it readable where the curve passes behind it.
  os << "<g font-size=\"12\">\n"
     << "<rect x=\"" << num(x - 8) << "\" y=\"" << num(y - 14) << "\" width=\"126\" height=\""
     << (with_val ? "40" : "22") << "\" fill=\"#ffffff\" fill-opacity=\"0.85\" stroke=\"#cccccc\"/>\n"
     << "<line x1=\"" << num(x) << "\" y1=\"" << num(y - 4) << "\" x2=\"" << num(x + 24)
     << "\" y2=\"" << num(y - 4) << "\" stroke=\"" << kTrainColor << "\" stroke-width=\"2\"/>\n"
     << "<text x=\"" << num(x + 30) << "\" y=\"" << num(y) << "\">train loss</text>\n";
  if (with_val)
    os << "<circle cx=\"" << num(x + 12) << "\" cy=\"" << num(y + 14) << "\" r=\"4\" fill=\""
       << kValColor << "\"/>\n"
       << "<text x=\"" << num(x + 30) << "\" y=\"" << num(y + 18) << "\">val loss</text>\n";
  os << "</g>\n";
}

}  // namespace

LossSeries loss_series(const std::vector<StepMetrics>& records) {
  LossSeries s;
  for (const StepMetrics& m : records) {
    s.train.push_back({m.step, m.loss});
    if (m.val_loss) s.val.push_back({m.step, *m.val_loss});
  }
  return s;
}

std::string loss_chart_svg(const LossSeries& series, const std::string& title) {
  Frame f = frame_for(series);
  std::ostringstream os;
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
     << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
     << "\" viewBox=\"0 0 " << kWidth << " " << kHeight
     << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
     << "<rect x=\"0\" y=\"0\" width=\"" << kWidth << "\" height=\"" << kHeight
     << "\" fill=\"#ffffff\"/>\n"
     << "<text x=\"" << num(kWidth / 2) << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">"
     << xml_escape(title) << "</text>\n";
  draw_axes(os, f);

  std::string points;
  for (const LossPoint& p : series.train) {
    if (!std::isfinite(p.loss)) continue;
    if (!points.empty()) points += ' ';
    points += num(f.px(double(p.step))) + "," + num(f.py(p.loss));
  }
  if (!points.empty())
    os << "<polyline fill=\"none\" stroke=\"" << kTrainColor
       << "\" stroke-width=\"1.5\" stroke-linejoin=\"round\" points=\"" << points << "\"/>\n";
  bool any_val = false;
  os << "<g fill=\"" << kValColor << "\">\n";
  for (const LossPoint& p : series.val) {
    if (!std::isfinite(p.loss)) continue;
    any_val = true;
    os << "<circle cx=\"" << num(f.px(double(p.step))) << "\" cy=\"" << num(f.py(p.loss))
       << "\" r=\"3.5\"/>\n";
  }
  os << "</g>\n";
  draw_legend(os, any_val);
  os << "</svg>\n";
  return os.str();
}

void write_loss_chart(const std::string& path, const LossSeries& series, const std::string& title) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  FSDP_CHECK(out, IoError, "cannot create loss chart '", path, "'");
  out << loss_chart_svg(series, title);
  out.flush();
  FSDP_CHECK(out, IoError, "cannot write loss chart '", path, "'");
}

}  // namespace fsdp::train
