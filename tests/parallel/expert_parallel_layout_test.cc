// The expert-parallel layout's index math on the host: which experts a rank holds, what it
// sends, and the regrouping of received rows from source-major to expert-major order,
// against a simulated exchange among the ranks of a group.
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/nn/expert_parallel_layout.h"
#include "tests/test_support.h"

using namespace fsdp;

namespace {

TEST_CASE("an expert-parallel layout holds equal contiguous parts of the experts", "[parallel]") {
  const auto l = nn::ExpertParallelLayout::make(8, 2, 1);
  CHECK(l.local_experts() == 4);
  CHECK(l.first_expert(1) == 4);
  CHECK(l.owner(3) == 0);
  CHECK(l.owner(4) == 1);
  CHECK(l.send_counts({1, 0, 2, 3, 0, 4, 1, 1}) == std::vector<size_t>{6, 6});
  CHECK_THROWS_AS(nn::ExpertParallelLayout::make(6, 4, 0), ShapeError);
  CHECK_THROWS_AS(nn::ExpertParallelLayout::make(8, 2, 2), ShapeError);
  CHECK_THROWS_AS(l.send_counts({1, 2}), ShapeError);
  CHECK_THROWS_AS(l.send_counts({1, 0, 2, 3, 0, -4, 1, 1}), ValueError);

  // Rank 1 receives, for its experts 4..7, {0, 4, 1, 1} rows from rank 0 and {2, 0, 0, 3}
  // from rank 1: source-major rows 0-3 are (rank 0, expert 5), 4 (0, 6), 5 (0, 7), 6-7
  // (1, 4), 8-10 (1, 7).
  const auto g = l.regroup({0, 4, 1, 1, 2, 0, 0, 3});
  CHECK(g.recv_counts == std::vector<size_t>{6, 5});
  CHECK(g.expert_counts == std::vector<int64_t>{2, 4, 1, 4});
  CHECK(g.gather == std::vector<int32_t>{6, 7, 0, 1, 2, 3, 4, 5, 8, 9, 10});
  for (size_t i = 0; i < g.gather.size(); ++i) CHECK(g.scatter[size_t(g.gather[i])] == int32_t(i));
  CHECK_THROWS_AS(l.regroup({0, 4, 1}), ShapeError);
}

// Every rank's rows, labelled (source rank, expert, index), sent by send_counts, received
// source-major and regrouped: each rank's experts see their rows in the order a single
// process that holds every rank's tokens in rank order would give them (by expert, then
// source, then index), and the inverse map restores the received order.
TEST_CASE("regrouping received rows gives the single process's order per expert", "[parallel]") {
  using Row = std::tuple<int, int64_t, int64_t>;  // source, expert, index
  for (const auto& [experts, ep] : {std::pair<int64_t, int>{8, 4}, {8, 1}, {6, 3}, {4, 4}}) {
    INFO(experts << " experts over " << ep << " ranks");
    std::mt19937 rng(unsigned(experts * 10 + ep));
    const size_t ranks = static_cast<size_t>(ep);
    std::vector<std::vector<int64_t>> counts(ranks, std::vector<int64_t>(static_cast<size_t>(experts)));
    for (auto& c : counts)
      for (auto& n : c) n = int64_t(rng() % 4);  // zero for some experts
    // Each source's send buffer: its rows by expert in global order.
    std::vector<std::vector<Row>> sent(ranks);
    for (int s = 0; s < ep; ++s)
      for (int64_t e = 0; e < experts; ++e)
        for (int64_t i = 0; i < counts[size_t(s)][size_t(e)]; ++i) sent[size_t(s)].push_back({s, e, i});
    for (int r = 0; r < ep; ++r) {
      const auto layout = nn::ExpertParallelLayout::make(experts, ep, r);
      const int64_t local = layout.local_experts();
      // The exchange: from each source, the part for rank r (its send_counts), source-major.
      std::vector<Row> received;
      std::vector<int64_t> received_counts;
      for (int s = 0; s < ep; ++s) {
        const auto sizes = nn::ExpertParallelLayout::make(experts, ep, s).send_counts(counts[size_t(s)]);
        size_t begin = 0;
        for (int p = 0; p < r; ++p) begin += sizes[size_t(p)];
        received.insert(received.end(), sent[size_t(s)].begin() + std::ptrdiff_t(begin),
                        sent[size_t(s)].begin() + std::ptrdiff_t(begin + sizes[size_t(r)]));
        for (int64_t e = 0; e < local; ++e)
          received_counts.push_back(counts[size_t(s)][size_t(layout.first_expert(r) + e)]);
      }
      const auto g = layout.regroup(received_counts);
      REQUIRE(g.gather.size() == received.size());
      std::vector<Row> grouped;
      for (int32_t j : g.gather) grouped.push_back(received[size_t(j)]);
      // The single process's order of rank r's experts' rows.
      std::vector<Row> want;
      for (int64_t e = layout.first_expert(r); e < layout.first_expert(r) + local; ++e)
        for (int s = 0; s < ep; ++s)
          for (int64_t i = 0; i < counts[size_t(s)][size_t(e)]; ++i) want.push_back({s, e, i});
      CHECK(grouped == want);
      size_t row = 0;
      for (int64_t e = 0; e < local; ++e) {
        for (int64_t i = 0; i < g.expert_counts[size_t(e)]; ++i)
          CHECK(std::get<1>(grouped[row++]) == layout.first_expert(r) + e);
      }
      std::vector<Row> back(received.size());
      for (size_t j = 0; j < received.size(); ++j) back[j] = grouped[size_t(g.scatter[j])];
      CHECK(back == received);
    }
  }
}

}  // namespace
