// Agreement between ranks during a save or a load: each phase runs on every rank, and a
// failure on any rank becomes an exception on every rank (never a hang at the next
// collective, never one rank carrying on with a partial checkpoint).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/core/context.h"

namespace fsdp::checkpoint {

// Runs `phase` on this rank, then agrees with every rank of `comm` on how it went: if it
// threw on some rank, every rank throws. The rank that failed first (lowest rank) is the one
// reported; a rank that failed rethrows its own exception, the others throw the same type
// (CheckpointError, IoError, ConfigError, or Error) with "rank R: <message>". `comm` null
// or of one rank: the phase simply runs. Collective: every rank calls it in the same order.
void run_on_every_rank(Context& ctx, Communicator* comm, const std::function<void()>& phase);

// Every rank's `mine`, in rank order (one string per rank). Collective.
std::vector<std::string> all_gather_strings(Context& ctx, Communicator* comm,
                                            const std::string& mine);

}  // namespace fsdp::checkpoint
