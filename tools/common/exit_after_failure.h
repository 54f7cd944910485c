// The tools' answer to a failed collective: make sure the process ends.
//
// The library aborts the communicators and raises the failure on the main thread, which
// prints it and ends the process. But after ncclCommAbort a collective's kernel may keep
// spinning on a peer that is gone; a main thread that was waiting for the device then never
// returns, and unwinding (a stream synchronize, cudaFree) can block the same way. So a tool
// passes this as WorldOptions::on_failure / TrainerOptions::on_comm_failure: if the process
// is still alive `grace` after the failure, it says so and exits with status 1, and the
// launcher ends the other ranks. Only binaries use this: the library never exits.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

namespace fsdp::tools {

inline std::function<void(const std::string&)> exit_after_failure(
    std::chrono::seconds grace = std::chrono::seconds(15)) {
  return [grace](const std::string& message) {
    std::thread([grace, message] {
      std::this_thread::sleep_for(grace);
      std::fprintf(stderr,
                   "error: the process was still running %lld s after a communication "
                   "failure (%s); exiting with status 1\n",
                   (long long)grace.count(), message.c_str());
      std::fflush(nullptr);
      std::_Exit(1);
    }).detach();
  };
}

}  // namespace fsdp::tools
