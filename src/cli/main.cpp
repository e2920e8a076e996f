// The loom binary: parses the command line and dispatches to one subcommand.
// Exit codes: 0 success, 1 runtime failure, 2 bad input (command line, config, files).
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "commands.h"
#include "loom/core/check.h"
#include "loom/core/cuda_support.h"
#include "version.h"

int main(int argc, char** argv) {
  // Before anything asks LibTorch about CUDA, which caches the answer (a no-op without a GPU).
  loom::device::load_cuda_support();
  CLI::App app{"loom: LLM pretraining on LibTorch (torchtitan-compatible configs)", "loom"};
  app.set_version_flag(
      "--version", [] { return loom::cli::version_text(); },
      "Print loom, LibTorch, CUDA, NCCL and Gloo versions and exit");
  app.require_subcommand(1);
  app.fallthrough(false);

  loom::cli::CommandRun run;
  loom::cli::add_train_command(app, run);
  loom::cli::add_config_command(app, run);
  loom::cli::add_plan_command(app, run);
  loom::cli::add_tokenize_command(app, run);
  loom::cli::add_prepare_data_command(app, run);
  loom::cli::add_launch_command(app, run);
  loom::cli::add_checkpoint_command(app, run);
  loom::cli::add_generate_command(app, run);
  loom::cli::add_eval_command(app, run);
  loom::cli::add_lighthouse_command(app, run);
  loom::cli::add_metrics_command(app, run);
  loom::cli::add_debug_command(app, run);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }
  try {
    const int status = run ? run() : 2;
    // What a command printed must have reached its reader: stdout on a full disk or a closed
    // pipe fails the command (it exited 0 having written nothing).
    errno = 0;
    std::cout.flush();
    const bool failed = std::cout.fail() || std::fflush(stdout) != 0 || std::ferror(stdout);
    if (failed) {
      std::cerr << "error: cannot write the output to standard output"
                << (errno ? std::string(": ") + std::strerror(errno) : std::string()) << "\n";
      return status == 0 ? 1 : status;
    }
    return status;
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  } catch (const loom::InputError& error) {
    std::cerr << "error: " << error.message() << "\n";
    return 2;
  } catch (const loom::Error& error) {
    std::cerr << "error: " << error.what() << "\n";
    return 1;
  } catch (const nlohmann::json::exception& error) {
    // A reader that let nlohmann's own exception through: still say it is the input's fault.
    std::cerr << "error: a JSON input holds a value of another type or shape than expected ("
              << error.what() << ")\n";
    return 2;
  } catch (const c10::Error& error) {
    // LibTorch's errors (a TCPStore that cannot connect, ...) without their C++ backtrace.
    std::cerr << "error: " << error.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "error: " << error.what() << "\n";
    return 1;
  }
}
