// The loss chart is well-formed SVG whose polyline carries one point per finite train loss.
#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/train/plot.h"
#include "tests/test_support.h"
#include "tests/train/scratch_dir.h"

using namespace fsdp;
using namespace fsdp::train;

namespace {

// A small XML well-formedness check: one root element, tags nested and closed in order,
// attributes quoted, no stray '<' or unescaped '&' in text. Returns "" or the problem.
std::string xml_problem(const std::string& doc) {
  static const std::regex open_tag(R"(^<([A-Za-z][\w:-]*)((?:\s+[\w:-]+="[^"<]*")*)\s*(/?)>)");
  static const std::regex close_tag(R"(^</([A-Za-z][\w:-]*)\s*>)");
  static const std::regex entity(R"(^&(amp|lt|gt|quot|apos|#[0-9]+);)");
  std::vector<std::string> open;
  int roots = 0;
  size_t i = 0;
  if (doc.compare(0, 5, "<?xml") == 0) i = doc.find("?>") + 2;
  while (i < doc.size()) {
    std::smatch m;
    std::string rest = doc.substr(i, 4096);
    if (doc[i] == '<') {
      if (std::regex_search(rest, m, close_tag)) {
        if (open.empty() || open.back() != m[1]) return "unexpected </" + m[1].str() + ">";
        open.pop_back();
      } else if (std::regex_search(rest, m, open_tag)) {
        if (open.empty()) ++roots;
        if (m[3].length() == 0) open.push_back(m[1]);
      } else {
        return "malformed tag at offset " + std::to_string(i);
      }
      i += size_t(m.length(0));
    } else if (doc[i] == '&') {
      if (!std::regex_search(rest, m, entity)) return "bare & at offset " + std::to_string(i);
      i += size_t(m.length(0));
    } else {
      if (open.empty() && !std::isspace(static_cast<unsigned char>(doc[i])))
        return "text outside the root element";
      ++i;
    }
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  if (roots != 1) return "expected one root element, found " + std::to_string(roots);
  return "";
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

// The (x, y) pairs of the document's one polyline.
std::vector<std::pair<double, double>> polyline_points(const std::string& svg) {
  std::smatch m;
  std::vector<std::pair<double, double>> out;
  if (!std::regex_search(svg, m, std::regex(R"re(<polyline[^>]*points="([^"]*)")re"))) return out;
  std::istringstream in(m[1].str());
  std::string pair;
  while (in >> pair) {
    size_t comma = pair.find(',');
    out.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
  }
  return out;
}

LossSeries falling_curve(int n) {
  LossSeries s;
  for (int step = 1; step <= n; ++step) {
    s.train.push_back({step, 4.0 + 7.0 * std::exp(-step / 30.0)});
    if (step % 25 == 0) s.val.push_back({step, 4.2 + 7.0 * std::exp(-step / 30.0)});
  }
  return s;
}

}  // namespace

TEST_CASE("the checker itself rejects broken XML", "[plot]") {
  CHECK(xml_problem("<svg><g></g></svg>").empty());
  CHECK_FALSE(xml_problem("<svg><g></svg>").empty());
  CHECK_FALSE(xml_problem("<svg a=b></svg>").empty());
  CHECK_FALSE(xml_problem("<svg>a & b</svg>").empty());
  CHECK_FALSE(xml_problem("<svg/><svg/>").empty());
}

TEST_CASE("the loss chart is well-formed SVG with one point per train loss", "[plot]") {
  LossSeries s = falling_curve(200);
  std::string svg = loss_chart_svg(s, "tiny: loss");
  INFO(svg.substr(0, 2000));
  CHECK(xml_problem(svg).empty());
  CHECK(svg.rfind("<?xml", 0) == 0);
  CHECK(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\"") != std::string::npos);
  CHECK(count(svg, "<polyline") == 1);
  std::vector<std::pair<double, double>> points = polyline_points(svg);
  REQUIRE(points.size() == 200);
  // Left to right in step order; the falling loss rises on the page (SVG y grows downward).
  for (size_t i = 1; i < points.size(); ++i) CHECK(points[i].first > points[i - 1].first);
  CHECK(points.back().second > points.front().second);
  // Everything inside the canvas.
  for (const auto& [x, y] : points) {
    CHECK(x >= 0);
    CHECK(x <= 800);
    CHECK(y >= 0);
    CHECK(y <= 480);
  }
  // Val markers (plus one in the legend), title, axis labels and tick labels.
  CHECK(count(svg, "<circle") == int(s.val.size()) + 1);
  CHECK(svg.find(">tiny: loss</text>") != std::string::npos);
  CHECK(svg.find(">step</text>") != std::string::npos);
  CHECK(svg.find(">loss</text>") != std::string::npos);
  CHECK(svg.find(">200</text>") != std::string::npos);  // last x tick
  CHECK(svg.find(">0</text>") != std::string::npos);    // x axis starts at 0
}

TEST_CASE("non-finite losses are left out and titles are escaped", "[plot]") {
  LossSeries s = falling_curve(50);
  s.train[10].loss = std::nan("");
  s.train[20].loss = INFINITY;
  std::string svg = loss_chart_svg(s, "a <b> & \"c\"");
  CHECK(xml_problem(svg).empty());
  CHECK(polyline_points(svg).size() == 48);
  CHECK(svg.find("a &lt;b&gt; &amp; &quot;c&quot;") != std::string::npos);
  CHECK(svg.find("nan") == std::string::npos);
  CHECK(svg.find("inf") == std::string::npos);
}

TEST_CASE("degenerate series still give a valid chart", "[plot]") {
  std::string empty = loss_chart_svg(LossSeries{}, "empty");
  CHECK(xml_problem(empty).empty());
  CHECK(count(empty, "<polyline") == 0);
  LossSeries one;
  one.train.push_back({1, 3.0});
  std::string single = loss_chart_svg(one, "one point");
  CHECK(xml_problem(single).empty());
  CHECK(polyline_points(single).size() == 1);
  LossSeries flat;
  for (int i = 0; i < 5; ++i) flat.train.push_back({i, 2.0});
  CHECK(polyline_points(loss_chart_svg(flat, "flat")).size() == 5);
}

TEST_CASE("loss_series takes train and val losses from metrics records", "[plot]") {
  std::vector<StepMetrics> records(3);
  for (int i = 0; i < 3; ++i) records[i].step = 10 * (i + 1), records[i].loss = 5 - i;
  records[1].val_loss = 4.5;
  LossSeries s = loss_series(records);
  REQUIRE(s.train.size() == 3);
  CHECK(s.train[2].step == 30);
  CHECK(s.train[2].loss == 3);
  REQUIRE(s.val.size() == 1);
  CHECK(s.val[0].step == 20);
  CHECK(s.val[0].loss == 4.5);
}

TEST_CASE("write_loss_chart writes the file and names a bad path", "[plot]") {
  std::string path = fsdp::testing::scratch_dir("plot") + "/loss.svg";
  write_loss_chart(path, falling_curve(20), "written");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str() == loss_chart_svg(falling_curve(20), "written"));
  CHECK_THROWS_WITH(write_loss_chart(path + "/nope/loss.svg", falling_curve(2), "x"),
                    Catch::Contains("loss.svg/nope/loss.svg"));
}
