// The watchdog's logic with fake probes (the NCCL backend gives it CUDA event queries).
#include <atomic>
#include <chrono>
#include <thread>

#include "collectives/watchdog.h"
#include "runtime/core/error.h"
#include "tests/test_support.h"

namespace fsdp {
namespace {

using Catch::Matchers::Contains;
using namespace std::chrono_literals;

CollectiveInfo op_info(CollectiveKind kind, const char* group, int64_t step) {
  CollectiveInfo info;
  info.kind = kind;
  info.count = 4096;
  info.dtype = DType::bf16;
  info.group = group;
  info.rank = 1;
  info.size = 2;
  info.step = step;
  return info;
}

// Polls `cond` for up to `limit`; true once it holds.
template <typename Cond>
bool eventually(Cond cond, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}

TEST_CASE("finished operations are dropped; nothing fires") {
  auto health = std::make_shared<CommHealth>(300ms);
  std::atomic<int> aborts{0};
  Watchdog::Hooks hooks;
  hooks.abort_all = [&] { ++aborts; };
  Watchdog dog(health, hooks, 20ms);
  std::atomic<bool> done{false};
  dog.watch([&] { return done.load(); }, op_info(CollectiveKind::all_gather, "dp_shard/ag", 3));
  dog.watch([] { return true; }, op_info(CollectiveKind::all_gather, "dp_shard/ag", 3));
  CHECK(eventually([&] { return dog.in_flight() == 1; }, 2000ms));
  done = true;
  CHECK(eventually([&] { return dog.in_flight() == 0; }, 2000ms));
  std::this_thread::sleep_for(400ms);  // past the timeout: nothing is left to fire on
  CHECK_FALSE(dog.fired());
  CHECK(aborts == 0);
  CHECK_NOTHROW(health->raise_if_failed());
}

TEST_CASE("a hung operation fires after the timeout, aborts once and names op, group, step") {
  auto health = std::make_shared<CommHealth>(500ms);
  std::atomic<int> aborts{0};
  Watchdog::Hooks hooks;
  hooks.abort_all = [&] { ++aborts; };
  Watchdog dog(health, hooks, 20ms);
  const auto start = std::chrono::steady_clock::now();
  dog.watch([] { return true; }, op_info(CollectiveKind::all_gather, "dp_shard/ag", 11));
  dog.watch([] { return false; }, op_info(CollectiveKind::reduce_scatter, "dp_shard/rs", 11));
  REQUIRE(eventually([&] { return dog.fired(); }, 5000ms));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(elapsed >= 500ms);
  CHECK(elapsed < 2000ms);
  CHECK(eventually([&] { return aborts == 1; }, 1000ms));
  CHECK(health->failure_kind() == FailureKind::Timeout);
  try {
    health->raise_if_failed();
    FAIL("no TimeoutError");
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), Contains("reduce_scatter of 4096 x bf16") &&
                             Contains("group 'dp_shard/rs'") && Contains("step 11"));
  }
  // Later operations are not watched: the job is over.
  dog.watch([] { return false; }, op_info(CollectiveKind::all_reduce, "world", 12));
  CHECK(dog.in_flight() == 0);
  std::this_thread::sleep_for(100ms);
  CHECK(aborts == 1);
}

TEST_CASE("an asynchronous error reported by the hook fires at once as a CommError") {
  auto health = std::make_shared<CommHealth>(60s);
  std::atomic<int> aborts{0};
  std::atomic<bool> broken{false};
  Watchdog::Hooks hooks;
  hooks.abort_all = [&] { ++aborts; };
  hooks.poll_errors = [&] { return broken ? std::string("remote peer closed") : std::string(); };
  Watchdog dog(health, hooks, 20ms);
  std::this_thread::sleep_for(60ms);
  CHECK_FALSE(dog.fired());
  broken = true;
  REQUIRE(eventually([&] { return dog.fired(); }, 2000ms));
  CHECK_THROWS_AS(health->raise_if_failed(), CommError);
  CHECK(health->failure_message() == "remote peer closed");
  CHECK(eventually([&] { return aborts == 1; }, 1000ms));
}

TEST_CASE("the first recorded failure wins") {
  CommHealth health(1s);
  CHECK(health.record_failure(FailureKind::Timeout, "first"));
  CHECK_FALSE(health.record_failure(FailureKind::CommFailure, "second"));
  CHECK(health.failure_message() == "first");
  CHECK_THROWS_AS(health.raise_if_failed(), TimeoutError);
}

}  // namespace
}  // namespace fsdp
