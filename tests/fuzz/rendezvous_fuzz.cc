// The rendezvous record a rank reads from FSDP_RENDEZVOUS_FILE (written by rank 0, polled by
// the others while it may still be incomplete).
// Properties: an accepted record has a plausible rank count and a payload within the bound,
// and formatting it gives back exactly the bytes read.
#include <optional>
#include <string>

#include "collectives/rendezvous.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp;
  const std::string contents(fuzz::bytes_of(data, size));
  const std::optional<RendezvousRecord> record = parse_rendezvous_record(contents);
  if (!record) return 0;
  if (record->size < 1) fuzz::property_failed("a record of fewer than one rank");
  if (record->payload.size() > kMaxRendezvousPayload) fuzz::property_failed("a payload over the bound");
  if (format_rendezvous_record(*record) != contents) fuzz::property_failed("a record does not round-trip");
  return 0;
}
