// metrics.jsonl records, resume behaviour, the step line, and FLOP/MFU arithmetic.
#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/train/metrics.h"
#include "runtime/train/metrics_line.h"
#include "tests/test_support.h"
#include "tests/train/scratch_dir.h"

using namespace fsdp;
using namespace fsdp::train;

namespace {

StepMetrics record(int64_t step, double loss) {
  StepMetrics m;
  m.step = step;
  m.loss = loss;
  m.lr = 1e-3;
  m.grad_norm = 0.75;
  m.tokens_per_sec = 12345.5;
  m.step_time_s = 0.25;
  m.mem_peak_bytes = int64_t(3) << 30;
  return m;
}

std::vector<std::string> file_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

std::string strip_ansi(const std::string& s) {
  return std::regex_replace(s, std::regex("\033\\[[0-9;]*m"), "");
}

}  // namespace

TEST_CASE("a metrics line is one JSON object with the required fields", "[metrics]") {
  StepMetrics m = record(10, 5.25);
  std::string line = metrics_json_line(m);
  CHECK(line.find('\n') == std::string::npos);
  nlohmann::json obj = nlohmann::json::parse(line);
  CHECK(obj["step"] == 10);
  CHECK(obj["loss"] == 5.25);
  CHECK(obj["lr"] == 1e-3);
  CHECK(obj["grad_norm"] == 0.75);
  CHECK(obj["tokens_per_sec"] == 12345.5);
  CHECK(obj["step_time_s"] == 0.25);
  CHECK(obj["mem_peak_bytes"] == int64_t(3) << 30);
  // Optional fields appear only when set.
  CHECK_FALSE(obj.contains("val_loss"));
  CHECK_FALSE(obj.contains("tflops"));
  CHECK_FALSE(obj.contains("mfu"));

  m.val_loss = 5.5;
  m.tflops = 312.5;
  m.mfu = 0.3159;
  StepMetrics back = parse_metrics_line(metrics_json_line(m));
  CHECK(back.step == 10);
  CHECK(back.loss == 5.25);
  CHECK(back.mem_peak_bytes == m.mem_peak_bytes);
  REQUIRE(back.val_loss.has_value());
  CHECK(*back.val_loss == 5.5);
  CHECK(*back.tflops == 312.5);
  CHECK(*back.mfu == 0.3159);
}

TEST_CASE("a non-finite loss is written as null and read back as NaN", "[metrics]") {
  StepMetrics m = record(3, std::nan(""));
  m.grad_norm = INFINITY;
  std::string line = metrics_json_line(m);
  CHECK(line.find("\"loss\":null") != std::string::npos);
  StepMetrics back = parse_metrics_line(line);
  CHECK(std::isnan(back.loss));
  CHECK(std::isnan(back.grad_norm));
  CHECK_THROWS_WITH(parse_metrics_line(R"({"step": 1, "loss": 2})"),
                    Catch::Contains("no 'lr'"));
  CHECK_THROWS_AS(parse_metrics_line("{\"step\": 1, "), DataError);
}

TEST_CASE("StepLogWriter flushes each line as it is written", "[metrics]") {
  std::string path = fsdp::testing::scratch_dir("metrics_flush") + "/sub/dir/metrics.jsonl";
  StepLogWriter writer(path);  // creates the missing directories
  writer.write(record(1, 6.0));
  // Read while the writer is still open: a killed run would leave exactly this.
  REQUIRE(file_lines(path).size() == 1);
  writer.write(record(2, 5.0));
  std::vector<std::string> lines = file_lines(path);
  REQUIRE(lines.size() == 2);
  CHECK(parse_metrics_line(lines[1]).loss == 5.0);
  std::vector<StepMetrics> all = read_metrics_file(path);
  REQUIRE(all.size() == 2);
  CHECK(all[0].step == 1);
  CHECK(all[1].step == 2);
}

TEST_CASE("a fresh run truncates, a resumed run keeps what came before", "[metrics]") {
  std::string path = fsdp::testing::scratch_dir("metrics_resume") + "/metrics.jsonl";
  {
    StepLogWriter w(path);
    for (int step = 1; step <= 5; ++step) w.write(record(step, 10.0 - step));
  }
  // Killed mid-line after step 5.
  std::ofstream(path, std::ios::app) << "{\"step\": 6, \"lo";

  {
    StepLogWriter resumed(path, /*resume_step=*/3);  // the checkpoint was at step 3
    resumed.write(record(4, 1.5));
  }
  std::vector<StepMetrics> after = read_metrics_file(path);
  REQUIRE(after.size() == 4);
  CHECK(after[0].step == 1);
  CHECK(after[2].step == 3);
  CHECK(after[3].step == 4);
  CHECK(after[3].loss == 1.5);  // the retrained step, not the old one

  { StepLogWriter fresh(path); }
  CHECK(read_metrics_file(path).empty());

  // Resuming where no file exists yet simply starts one.
  std::string other = fsdp::testing::scratch_dir("metrics_resume_new") + "/metrics.jsonl";
  StepLogWriter(other, 7).write(record(8, 2.0));
  CHECK(read_metrics_file(other).size() == 1);
}

TEST_CASE("read_metrics_file skips a torn last line and names a bad one", "[metrics]") {
  std::string dir = fsdp::testing::scratch_dir("metrics_read");
  std::string torn = dir + "/torn.jsonl";
  std::ofstream(torn) << metrics_json_line(record(1, 3.0)) << "\n{\"step\": 2, \"loss\"";
  CHECK(read_metrics_file(torn).size() == 1);

  std::string bad = dir + "/bad.jsonl";
  std::ofstream(bad) << metrics_json_line(record(1, 3.0)) << "\nnot json\n"
                     << metrics_json_line(record(2, 2.0)) << "\n";
  CHECK_THROWS_WITH(read_metrics_file(bad), Catch::Contains("bad.jsonl:2: "));
  CHECK_THROWS_AS(read_metrics_file(dir + "/missing.jsonl"), IoError);
}

TEST_CASE("FLOPs per token and MFU follow 6N + 12*L*d*T", "[metrics]") {
  // GPT-2 124M at seq 1024: 6 * 124,475,904 + 12 * 12 * 768 * 1024.
  double fpt = flops_per_token(124475904, 12, 768, 1024);
  CHECK(fpt == 6.0 * 124475904 + 12.0 * 12 * 768 * 1024);
  CHECK(fpt == 746855424.0 + 113246208.0);
  double mfu = model_flops_utilization(400000.0, fpt, kH200PeakBf16Flops);
  CHECK(mfu == Approx(400000.0 * fpt / 989e12).epsilon(1e-15));
  CHECK(mfu == Approx(0.3479).epsilon(1e-3));
  CHECK_THROWS_AS(model_flops_utilization(1, 1, 0), ValueError);
}

TEST_CASE("the plain step line has every field and no escape codes", "[metrics]") {
  StepMetrics m = record(10, 5.4321);
  std::string plain = format_step_line(m, 200, /*terminal=*/false);
  CHECK(plain == "step 10/200 | loss 5.4321 | lr 1.000e-03 | grad norm 0.750 | 12.3k tok/s | "
                 "mem 3.00 GiB | 250.0 ms");
  m.val_loss = 5.5;
  m.tflops = 123.4;
  m.mfu = 0.125;
  std::string full = format_step_line(m, 200, false);
  CHECK(full == "step 10/200 | loss 5.4321 | val 5.5000 | lr 1.000e-03 | grad norm 0.750 | "
                "12.3k tok/s | 123.4 TFLOP/s | MFU 12.5% | mem 3.00 GiB | 250.0 ms");
  CHECK(full.find('\033') == std::string::npos);
  CHECK(format_step_line(m, 200, false, RunClock{65.2, 425.0}) == full + " | 1m05s elapsed | eta 7m05s");
  CHECK(format_step_line(m, 200, false, RunClock{3.0, std::nullopt}) == full + " | 3s elapsed");
  // mixed_precision.fp8: how many linear layers run in FP8, after the rate.
  m.fp8_layers = 40;
  CHECK(format_step_line(m, 200, false) ==
        "step 10/200 | loss 5.4321 | val 5.5000 | lr 1.000e-03 | grad norm 0.750 | "
        "12.3k tok/s | fp8 40 layers | 123.4 TFLOP/s | MFU 12.5% | mem 3.00 GiB | 250.0 ms");
}

TEST_CASE("the terminal step line is colored and its columns line up", "[metrics]") {
  StepMetrics a = record(5, 10.5);
  StepMetrics b = record(150, 2.25);
  b.tokens_per_sec = 950;
  b.mem_peak_bytes = 512;
  b.step_time_s = 0.0125;
  std::string la = format_step_line(a, 200, /*terminal=*/true);
  std::string lb = format_step_line(b, 200, true);
  CHECK(la.find("\033[") != std::string::npos);
  std::string pa = strip_ansi(la), pb = strip_ansi(lb);
  CHECK(pa.size() == pb.size());
  // Each separator sits at the same column in both lines.
  for (size_t i = pa.find('|'); i != std::string::npos; i = pa.find('|', i + 1)) {
    INFO(pa << "\n" << pb);
    CHECK(pb[i] == '|');
  }
}

TEST_CASE("bytes and counts are shown with units", "[metrics]") {
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(int64_t(80) << 30) == "80.0 GiB");
  CHECK(format_bytes(int64_t(141) << 30) == "141 GiB");
  CHECK(format_count(950) == "950");
  CHECK(format_count(12345) == "12.3k");
  CHECK(format_count(1.5e6) == "1.50M");
}

TEST_CASE("durations are shown in their two largest units", "[metrics]") {
  CHECK(format_duration(0.4) == "0s");
  CHECK(format_duration(42) == "42s");
  CHECK(format_duration(425) == "7m05s");
  CHECK(format_duration(3 * 3600 + 12 * 60 + 59) == "3h12m");
  CHECK(format_duration(2 * 86400 + 4 * 3600) == "2d04h");
  CHECK(format_duration(-1) == "?");
  CHECK(format_duration(1.0 / 0.0) == "?");
}

TEST_CASE("an MoE model's losses and load are in its step line and metrics record", "[metrics]") {
  StepMetrics m = record(10, 5.4321);
  CHECK(metrics_json_line(m).find("moe_") == std::string::npos);  // dense: absent
  m.moe_aux_loss = 2.0625;
  m.moe_z_loss = 0.125;
  m.moe_max_load = 1.75;
  CHECK(format_step_line(m, 200, false) ==
        "step 10/200 | loss 5.4321 | lr 1.000e-03 | grad norm 0.750 | aux 2.0625 | z 0.1250 | "
        "max load 1.75 | 12.3k tok/s | mem 3.00 GiB | 250.0 ms");
  const StepMetrics back = parse_metrics_line(metrics_json_line(m));
  REQUIRE(back.moe_aux_loss);
  CHECK(*back.moe_aux_loss == 2.0625);
  REQUIRE(back.moe_z_loss);
  CHECK(*back.moe_z_loss == 0.125);
  REQUIRE(back.moe_max_load);
  CHECK(*back.moe_max_load == 1.75);
  CHECK(back.moe_expert_tokens.empty());  // logger.log_expert_tokens off
  m.moe_expert_tokens = {{3, 0, 5}, {1, 7, 0}};
  CHECK(parse_metrics_line(metrics_json_line(m)).moe_expert_tokens == m.moe_expert_tokens);
  CHECK_THROWS_AS(parse_metrics_line(R"({"step": 1, "moe_expert_tokens": [[1, 2.5]]})"),
                  DataError);
  CHECK_THROWS_AS(parse_metrics_line(R"({"step": 1, "moe_expert_tokens": [3]})"), DataError);
  CHECK_FALSE(parse_metrics_line(metrics_json_line(record(1, 1.0))).moe_aux_loss);
}
