#include "support/process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>

namespace loom::testing {

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    throw std::runtime_error("popen failed for: " + command);
  }
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    result.output.append(buffer.data(), n);
  }
  int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

CommandResult run_loom(const std::string& args) {
  return run_command(std::string("'") + LOOM_BINARY + "' " + args);
}

std::string fresh_temp_dir(const std::string& name) {
  std::filesystem::path dir = std::filesystem::path(LOOM_TEST_TMPDIR) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

namespace {

// Under <tmp>/shared/name.lock: the folder as it is when its identity file says `identity`, else
// emptied and filled by `make` (a command line given the folder), the identity written after.
std::string made_once(const std::string& name, const std::string& identity,
                      const std::function<std::string(const std::string& folder)>& make) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(LOOM_TEST_TMPDIR) / "shared";
  fs::create_directories(root);
  const fs::path folder = root / name;
  const int lock = ::open((root / (name + ".lock")).c_str(), O_CREAT | O_RDWR, 0644);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) {
    throw std::runtime_error("shared folder: cannot lock " + folder.string());
  }
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }  // releases the flock
  } unlock{lock};
  if (read_text((folder / "identity").string()) == identity) return folder.string();
  fs::remove_all(folder);
  fs::create_directories(folder);
  CommandResult result = run_command(make(folder.string()));
  if (result.exit_code != 0) {
    throw std::runtime_error("shared " + name + " failed (exit " +
                             std::to_string(result.exit_code) + "):\n" + result.output);
  }
  std::ofstream(folder / "identity") << identity;
  return folder.string();
}

}  // namespace

std::string shared_run(const std::string& name, const std::string& args,
                       const std::string& environment) {
  // What identifies a run: its args and the binary it ran (rebuilt loom, new reference).
  const std::string identity =
      environment + args + "\n" +
      std::to_string(std::filesystem::last_write_time(LOOM_BINARY).time_since_epoch().count());
  return made_once(name, identity, [&](const std::string& folder) {
    std::string command = args;
    for (size_t at = command.find("{port}"); at != std::string::npos; at = command.find("{port}")) {
      command.replace(at, 6, std::to_string(free_port()));
    }
    return environment + " '" + LOOM_BINARY + "' " + command + " --job.dump_folder " + folder;
  });
}

std::string shared_folder(const std::string& name, const std::string& command,
                          const std::string& identity) {
  return made_once(name, identity,
                   [&](const std::string& folder) { return command + " '" + folder + "'"; });
}

std::string copy_of_checkpoint(const std::string& from, int step, const std::string& name) {
  namespace fs = std::filesystem;
  const std::string folder = fresh_temp_dir(name);
  const std::string step_dir = "/checkpoint/step-" + std::to_string(step);
  fs::create_directories(folder + "/checkpoint");
  fs::copy(from + step_dir, folder + step_dir, fs::copy_options::recursive);
  return folder;
}

std::string launch_args(int ranks, const std::string& job_args, const std::string& port) {
  return "launch --nproc-per-node " + std::to_string(ranks) + " --master-port " + port + " -- " +
         job_args;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  if (fd >= 0) ::close(fd);
  if (!ok) throw std::runtime_error("free_port: cannot bind a socket on 127.0.0.1");
  return ntohs(addr.sin_port);
}

}  // namespace loom::testing
