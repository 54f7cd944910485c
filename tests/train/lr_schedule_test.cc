// Learning-rate schedules against values worked out by hand.
#include <cmath>

#include "runtime/core/error.h"
#include "runtime/train/recipe.h"
#include "runtime/train/lr_schedule.h"
#include "tests/test_support.h"

using namespace fsdp;
using namespace fsdp::train;

namespace {

constexpr double kPi = 3.14159265358979323846;

LrSchedule schedule(DecayStyle style, double lr, double min_lr, int64_t warmup, int64_t decay,
                    int64_t wsd_decay = 0, WsdDecayStyle wsd_style = WsdDecayStyle::Linear) {
  LrSchedule s;
  s.style = style;
  s.lr = lr;
  s.min_lr = min_lr;
  s.warmup_iters = warmup;
  s.decay_iters = decay;
  s.wsd_decay_iters = wsd_decay;
  s.wsd_style = wsd_style;
  return s;
}

Approx exactly(double v) { return Approx(v).epsilon(1e-12).margin(1e-15); }

}  // namespace

TEST_CASE("warmup is linear: lr * (step + 1) / warmup_iters", "[schedule]") {
  LrSchedule s = schedule(DecayStyle::Cosine, 1e-3, 0, 10, 100);
  CHECK(s.lr_at(0) == exactly(1e-4));
  CHECK(s.lr_at(4) == exactly(5e-4));
  CHECK(s.lr_at(9) == exactly(1e-3));
  CHECK(s.lr_at(10) == exactly(1e-3));  // decay starts at the peak
}

TEST_CASE("cosine decays from lr to min_lr over the steps after warmup", "[schedule]") {
  LrSchedule s = schedule(DecayStyle::Cosine, 1.0, 0.1, 0, 100);
  CHECK(s.lr_at(0) == exactly(1.0));
  CHECK(s.lr_at(25) == exactly(0.1 + 0.9 * 0.5 * (1 + std::cos(kPi / 4))));
  CHECK(s.lr_at(50) == exactly(0.55));
  CHECK(s.lr_at(99) == exactly(0.1 + 0.9 * 0.5 * (1 + std::cos(kPi * 0.99))));
  CHECK(s.lr_at(100) == exactly(0.1));
  CHECK(s.lr_at(5000) == exactly(0.1));

  LrSchedule warm = schedule(DecayStyle::Cosine, 1.0, 0.1, 10, 110);
  CHECK(warm.lr_at(60) == exactly(0.55));  // halfway through the 100 decay steps
}

TEST_CASE("linear decays in a straight line and then holds min_lr", "[schedule]") {
  LrSchedule s = schedule(DecayStyle::Linear, 2.0, 0.0, 0, 100);
  CHECK(s.lr_at(25) == exactly(1.5));
  CHECK(s.lr_at(50) == exactly(1.0));
  CHECK(s.lr_at(100) == exactly(0.0));
  LrSchedule warm = schedule(DecayStyle::Linear, 1.0, 0.5, 20, 70);
  CHECK(warm.lr_at(19) == exactly(1.0));
  CHECK(warm.lr_at(45) == exactly(0.75));
  CHECK(warm.lr_at(70) == exactly(0.5));
}

TEST_CASE("constant holds lr after warmup, even past decay_iters", "[schedule]") {
  LrSchedule s = schedule(DecayStyle::Constant, 3e-4, 0, 5, 10);
  CHECK(s.lr_at(0) == exactly(6e-5));
  CHECK(s.lr_at(5) == exactly(3e-4));
  CHECK(s.lr_at(1000) == exactly(3e-4));
}

TEST_CASE("WSD: warmup, stable at lr, then a final decay of wsd_decay_iters", "[schedule]") {
  LrSchedule s = schedule(DecayStyle::WSD, 1.0, 0.0, 10, 100, 20, WsdDecayStyle::Linear);
  CHECK(s.lr_at(0) == exactly(0.1));
  CHECK(s.lr_at(50) == exactly(1.0));
  CHECK(s.lr_at(79) == exactly(1.0));
  CHECK(s.lr_at(80) == exactly(1.0));
  CHECK(s.lr_at(85) == exactly(0.75));
  CHECK(s.lr_at(90) == exactly(0.5));
  CHECK(s.lr_at(100) == exactly(0.0));

  s.wsd_style = WsdDecayStyle::Cosine;
  CHECK(s.lr_at(85) == exactly(0.5 * (1 + std::cos(kPi / 4))));
  CHECK(s.lr_at(90) == exactly(0.5));
  s.wsd_style = WsdDecayStyle::Exponential;
  CHECK(s.lr_at(90) == exactly(2 * std::sqrt(0.5) - 1));
  CHECK(s.lr_at(80) == exactly(1.0));
  s.wsd_style = WsdDecayStyle::MinusSqrt;
  CHECK(s.lr_at(85) == exactly(0.5));

  LrSchedule floor = schedule(DecayStyle::WSD, 1.0, 0.2, 0, 10, 4, WsdDecayStyle::Linear);
  CHECK(floor.lr_at(8) == exactly(0.2 + 0.8 * 0.5));
  CHECK(floor.lr_at(12) == exactly(0.2));
}

TEST_CASE("a schedule is built from the recipe's sections", "[schedule]") {
  Recipe r = parse_recipe(R"({"train": {"train_iters": 200},
                              "optimizer": {"lr": 1e-3, "min_lr": 1e-4},
                              "scheduler": {"lr_decay_style": "cosine", "lr_warmup_iters": 20}})");
  LrSchedule s = LrSchedule::from_recipe(r);
  CHECK(s.style == DecayStyle::Cosine);
  CHECK(s.decay_iters == 200);  // 0 in the recipe means train_iters
  CHECK(s.lr_at(0) == exactly(5e-5));
  CHECK(s.lr_at(110) == exactly(1e-4 + 9e-4 * 0.5));
  CHECK(s.lr_at(199) < 1.01e-4);

  Recipe wsd = parse_recipe("{}", {"scheduler.lr_decay_style=WSD", "scheduler.lr_wsd_decay_iters=5",
                                   "scheduler.lr_wsd_decay_style=cosine"});
  LrSchedule w = LrSchedule::from_recipe(wsd);
  CHECK(w.style == DecayStyle::WSD);
  CHECK(w.wsd_style == WsdDecayStyle::Cosine);
  CHECK(w.wsd_decay_iters == 5);
}

TEST_CASE("schedule names parse and bad ones are refused", "[schedule]") {
  CHECK(decay_style_from_name("linear") == DecayStyle::Linear);
  CHECK(decay_style_from_name("constant") == DecayStyle::Constant);
  CHECK(wsd_decay_style_from_name("minus_sqrt") == WsdDecayStyle::MinusSqrt);
  CHECK_THROWS_WITH(decay_style_from_name("step"), Catch::Contains("scheduler.lr_decay_style"));
  CHECK_THROWS_AS(wsd_decay_style_from_name("sqrt"), ConfigError);
  CHECK_THROWS_AS(schedule(DecayStyle::Cosine, 1, 0, 0, 10).lr_at(-1), ValueError);
}
