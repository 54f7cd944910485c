// The main() of every fsdp.cpp test binary.
//
// Besides running Catch2, it records each test case's outcome (passed, failed, skipped)
// and writes them as JUnit XML to $XML_OUTPUT_FILE when Bazel asks for it, so that
// scripts/test.sh can count test cases rather than test binaries. Built with
// FSDP_TEST_MPI, it initializes MPI, and a test case counts as passed only if it passed
// on every rank.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "tests/test_support.h"

#if FSDP_TEST_MPI
#include <mpi.h>
#endif

namespace fsdp::testing {
namespace {

enum Outcome : int { kPassed = 0, kSkipped = 1, kFailed = 2 };

struct Record {
  std::string name;
  int outcome;
  std::string message;
};

// Test-harness state: which cases ran and how they ended. Lives only in test binaries.
struct Results {
  std::vector<Record> records;
  std::set<std::string> skipped;
  std::string skip_reason;
  std::string current;
};

Results& results() {
  static Results r;
  return r;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

class OutcomeListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    results().current = info.name;
  }

  void testCaseEnded(Catch::TestCaseStats const& stats) override {
    const std::string& name = stats.testInfo.name;
    Record r{name, kPassed, ""};
    if (stats.totals.assertions.failed > 0 || stats.totals.testCases.failed > 0) {
      r.outcome = kFailed;
      r.message = std::to_string(stats.totals.assertions.failed) + " assertion(s) failed";
    } else if (results().skipped.count(name)) {
      r.outcome = kSkipped;
      r.message = results().skip_reason;
    }
    results().records.push_back(r);
  }
};

void write_junit(const std::vector<Record>& records, const char* path, const char* suite) {
  int failures = 0, skipped = 0;
  for (const auto& r : records) {
    failures += r.outcome == kFailed;
    skipped += r.outcome == kSkipped;
  }
  std::ofstream out(path);
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n<testsuite name=\""
      << xml_escape(suite) << "\" tests=\"" << records.size() << "\" failures=\"" << failures
      << "\" errors=\"0\" skipped=\"" << skipped << "\">\n";
  for (const auto& r : records) {
    out << "<testcase name=\"" << xml_escape(r.name) << "\">";
    if (r.outcome == kFailed) out << "<failure message=\"" << xml_escape(r.message) << "\"/>";
    if (r.outcome == kSkipped) out << "<skipped message=\"" << xml_escape(r.message) << "\"/>";
    out << "</testcase>\n";
  }
  out << "</testsuite>\n</testsuites>\n";
}

}  // namespace

CATCH_REGISTER_LISTENER(OutcomeListener)

void mark_skipped(const std::string& reason) {
  results().skipped.insert(results().current);
  results().skip_reason = reason;
  WARN("SKIPPED: " << reason);
}

bool gpu_available() { return cuda_device_count() > 0; }

const char* gpu_backend_name() {
  const char* name = std::getenv("FSDP_TEST_GPU_BACKEND");
  return name && *name ? name : "nccl";
}

#if FSDP_TEST_MPI
int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
#else
int world_rank() { return 0; }
int world_size() { return 1; }
#endif

}  // namespace fsdp::testing

int main(int argc, char** argv) {
  using namespace fsdp::testing;
#if FSDP_TEST_MPI
  // The staged backend's worker threads call MPI (collectives/staged_communicator.h).
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
#endif
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();

  std::vector<Record> merged = results().records;
  // Bazel names the target in TEST_TARGET; outside Bazel the binary's name will do.
  const char* target = std::getenv("TEST_TARGET");
  const char* suite = target ? target : (argc > 0 ? argv[0] : "tests");
#if FSDP_TEST_MPI
  // A test case passes only where it passed on every rank. Ranks run the same cases in
  // the same order; if their counts differ, every case is counted as failed.
  int count = int(merged.size()), max_count = 0, min_count = 0;
  MPI_Allreduce(&count, &max_count, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&count, &min_count, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (max_count != min_count) {
    for (auto& r : merged) {
      r.outcome = kFailed;
      r.message = "ranks ran different numbers of test cases";
    }
  } else {
    std::vector<int> mine(count), worst(count);
    for (int i = 0; i < count; ++i) mine[i] = merged[i].outcome;
    MPI_Allreduce(mine.data(), worst.data(), count, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    for (int i = 0; i < count; ++i) {
      if (worst[i] == kFailed && merged[i].outcome != kFailed) {
        merged[i].outcome = kFailed;
        merged[i].message = "failed on another rank";
      }
    }
  }
  int any_failed = rc != 0, all_ok = 0;
  MPI_Allreduce(&any_failed, &all_ok, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const bool write = world_rank() == 0;
  MPI_Finalize();
  if (all_ok != 0 && rc == 0) rc = 1;
#else
  const bool write = true;
#endif
  const char* xml = std::getenv("XML_OUTPUT_FILE");
  if (write && xml && *xml) write_junit(merged, xml, suite);
  return rc;
}
