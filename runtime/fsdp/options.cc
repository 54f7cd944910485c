#include "runtime/fsdp/options.h"

#include "runtime/core/error.h"

namespace fsdp {

const char* unit_module_kind(UnitKind kind) {
  switch (kind) {
    case UnitKind::block: return "block";
  }
  return "?";
}

UnitKind unit_kind_from_name(const std::string& name) {
  if (name == "block") return UnitKind::block;
  FSDP_THROW(ConfigError, "unknown FSDP unit kind '", name, "' (expected block)");
}

}  // namespace fsdp
