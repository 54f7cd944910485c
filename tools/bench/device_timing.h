// Device time of a piece of GPU work, for the benchmarks that time kernels directly.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/stream.h"

namespace fsdp::bench {

// The median over `reps` runs of `work`, in ms of ctx's stream (CUDA events), after
// `warmups` untimed runs.
inline double median_device_ms(Context& ctx, int reps, int warmups,
                               const std::function<void()>& work) {
  for (int i = 0; i < warmups; ++i) work();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    Event start = Event::create(ctx.device(), true), end = Event::create(ctx.device(), true);
    start.record(ctx.stream());
    work();
    end.record(ctx.stream());
    end.synchronize();
    ms.push_back(Event::elapsed_ms(start, end));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace fsdp::bench
