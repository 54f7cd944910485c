#include <atomic>
#include <stdexcept>
#include <vector>

#include "runtime/core/thread_pool.h"
#include "tests/test_support.h"

using namespace fsdp;

TEST_CASE("ThreadPool runs every index once, loop after loop", "[core]") {
  for (unsigned threads : {1u, 2u, 5u}) {
    INFO(threads << " threads");
    ThreadPool pool(threads);
    CHECK(pool.size() == threads);
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1000)}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      for (auto& h : hits) h = 0;
      pool.parallel_for(n, [&](int64_t i) { hits[size_t(i)]++; });
      for (int64_t i = 0; i < n; ++i) CHECK(hits[size_t(i)] == 1);
    }
    // Many short loops in a row: no loop may start before the previous one has drained.
    std::atomic<int64_t> sum{0};
    for (int k = 0; k < 200; ++k) pool.parallel_for(10, [&](int64_t i) { sum += i; });
    CHECK(sum == 200 * 45);
  }
}

TEST_CASE("ThreadPool rethrows the first failure and stays usable", "[core]") {
  ThreadPool pool(3);
  std::atomic<int> ran{0};
  CHECK_THROWS_AS(pool.parallel_for(100,
                                    [&](int64_t i) {
                                      ran++;
                                      if (i == 5) throw std::runtime_error("index 5");
                                    }),
                  std::runtime_error);
  CHECK(ran <= 100);
  std::atomic<int> after{0};
  pool.parallel_for(20, [&](int64_t) { after++; });
  CHECK(after == 20);
}

TEST_CASE("host_threads_per_process shares this process's CPUs", "[core]") {
  const unsigned one = host_threads_per_process(1);
  CHECK(one >= 1);
  CHECK(host_threads_per_process(2) >= 1);
  CHECK(host_threads_per_process(2) <= one);
  CHECK(host_threads_per_process(1000) == 1);
}
