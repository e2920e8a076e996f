// Shared by the libFuzzer harnesses: a private scratch folder for loaders that take a path.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace loom::fuzz {

inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("LOOM_FUZZ_TMPDIR");
    std::string d = std::string(base ? base : "/tmp") + "/loom-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes the input to scratch_dir()/name and returns the path.
inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace loom::fuzz
