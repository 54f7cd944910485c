// The command line of the train binary, parsed into a value (tested without running).
//
//   train --config FILE [KEY=VALUE ...] [--set KEY=VALUE ...] [--dry-run] [--no-resume]
//   train --help | --version
#pragma once

#include <string>
#include <vector>

namespace fsdp::train {

struct CommandLine {
  std::string config;                  // --config FILE (required unless --help/--version)
  std::vector<std::string> overrides;  // KEY=VALUE, in order (later ones win)
  bool dry_run = false;
  bool no_resume = false;
  bool help = false;
  bool version = false;
};

// Throws ConfigError (exit code 2) for unknown flags, a missing --config or a malformed
// override, with a message that says what was expected.
CommandLine parse_command_line(const std::vector<std::string>& args);

// The usage text: flags, exit codes, then every recipe key (from the recipe schema).
std::string usage_text();

}  // namespace fsdp::train
