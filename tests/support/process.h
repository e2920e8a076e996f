// Running the loom binary from tests.
#pragma once

#include <string>

namespace loom::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line, capturing its output.
CommandResult run_command(const std::string& command);

// Runs `loom <args>` (the binary of this build).
CommandResult run_loom(const std::string& args);

// A fresh, empty folder for one test under the build tree.
std::string fresh_temp_dir(const std::string& name);

// A TCP port on 127.0.0.1 nothing listens on right now (the kernel picks it).
int free_port();

// The whole content of a file; empty when it does not exist.
std::string read_text(const std::string& path);

}  // namespace loom::testing
