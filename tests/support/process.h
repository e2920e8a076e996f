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

// The dump folder of `loom <args> --job.dump_folder FOLDER`, run once for every test process
// that asks with the same `name` and args (a reference run several tests compare against, e.g.
// one rank with the global batch): the first caller runs it under a file lock while the others
// wait, later callers reuse it. A different build of loom or other args run it again. A
// "{port}" in args becomes a free port when it runs (and is not part of the identity). Throws
// std::runtime_error with the output when the run fails. `environment` ("NAME=value ...")
// prefixes the command and is part of the run's identity.
std::string shared_run(const std::string& name, const std::string& args,
                       const std::string& environment = "");

// The folder <tmp>/shared/`name` that `command` FOLDER fills, made once for the same `identity`
// and reused by every test process after (under a file lock, as shared_run: the others wait).
// Throws std::runtime_error with the output when the command fails.
std::string shared_folder(const std::string& name, const std::string& command,
                          const std::string& identity);

// A fresh run folder (fresh_temp_dir(name)) holding a copy of the checkpoint step-`step` of the
// run in `from`: a `loom train` with that dump folder resumes from it.
std::string copy_of_checkpoint(const std::string& from, int step, const std::string& name);

// `loom launch --nproc-per-node N --master-port PORT -- <job_args>`; `port`: a number, or
// "{port}" for shared_run to fill in.
std::string launch_args(int ranks, const std::string& job_args,
                        const std::string& port = std::to_string(free_port()));

// The whole content of a file; empty when it does not exist.
std::string read_text(const std::string& path);

// Whether `text` (a command's output, a log) holds `part`.
inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace loom::testing
