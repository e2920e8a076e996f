// File writes that never leave a half-written file behind: write a temporary file in the same
// folder, fsync it, rename it over the target, fsync the folder.
#pragma once

#include <string>

namespace loom::files {

// Throws loom::IoError naming the path and the system error.
void write_atomic(const std::string& path, const std::string& content);

// fsyncs a folder so renames and new entries in it are durable (best effort where refused).
void sync_folder(const std::string& path);

// Creates the folder and its parents; throws loom::IoError when that fails.
void create_directories(const std::string& path);

}  // namespace loom::files
