#include "runtime/checkpoint/rank_agreement.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include "kernels/ops.h"

namespace fsdp::checkpoint {
namespace {

// The error kinds that cross ranks, as the first character of a failure record.
enum class Kind : char { checkpoint = 'C', io = 'I', config = 'G', other = 'E' };

[[noreturn]] void throw_as(Kind kind, const std::string& message) {
  switch (kind) {
    case Kind::checkpoint: throw CheckpointError(message);
    case Kind::io: throw IoError(message);
    case Kind::config: throw ConfigError(message);
    case Kind::other: break;
  }
  throw Error(message);
}

}  // namespace

std::vector<std::string> all_gather_strings(Context& ctx, Communicator* comm,
                                            const std::string& mine) {
  if (!comm || comm->size() == 1) return {mine};
  const int n = comm->size();
  // Lengths first, then every string padded to the longest.
  Tensor len = ops::from_host<int64_t>(ctx, {int64_t(mine.size())}, Shape{1});
  Tensor lens = ctx.empty(Shape{n}, DType::i64);
  comm->all_gather(lens, len, ctx.stream());
  const std::vector<int64_t> sizes = ops::to_vector<int64_t>(ctx, lens);
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<std::string> out(static_cast<size_t>(n));
  if (longest == 0) return out;
  std::vector<uint8_t> padded(size_t(longest), 0);
  std::memcpy(padded.data(), mine.data(), mine.size());
  Tensor part = ops::from_host<uint8_t>(ctx, padded, Shape{longest});
  Tensor all = ctx.empty(Shape{n * longest}, DType::u8);
  comm->all_gather(all, part, ctx.stream());
  const std::vector<uint8_t> bytes = ops::to_vector<uint8_t>(ctx, all);
  for (int r = 0; r < n; ++r)
    out[size_t(r)].assign(reinterpret_cast<const char*>(bytes.data()) + size_t(r * longest),
                          size_t(sizes[size_t(r)]));
  return out;
}

void run_on_every_rank(Context& ctx, Communicator* comm, const std::function<void()>& phase) {
  if (!comm || comm->size() == 1) {
    phase();
    return;
  }
  std::exception_ptr failure;
  std::string record;  // empty: this rank succeeded
  try {
    phase();
  } catch (const CheckpointError& e) {
    failure = std::current_exception();
    record = std::string(1, char(Kind::checkpoint)) + e.what();
  } catch (const IoError& e) {
    failure = std::current_exception();
    record = std::string(1, char(Kind::io)) + e.what();
  } catch (const ConfigError& e) {
    failure = std::current_exception();
    record = std::string(1, char(Kind::config)) + e.what();
  } catch (const std::exception& e) {
    failure = std::current_exception();
    record = std::string(1, char(Kind::other)) + e.what();
  }
  const std::vector<std::string> records = all_gather_strings(ctx, comm, record);
  if (failure) std::rethrow_exception(failure);
  for (size_t r = 0; r < records.size(); ++r) {
    if (records[r].empty()) continue;
    throw_as(Kind(records[r][0]), str_cat("rank ", r, ": ", records[r].substr(1)));
  }
}

}  // namespace fsdp::checkpoint
