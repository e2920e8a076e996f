// File writes that never leave a half-written file behind: write a temporary file in the same
// folder, fsync it, rename it over the target, fsync the folder.
#pragma once

#include <cstdint>
#include <string>

namespace loom::files {

// Throws loom::IoError naming the path and the system error.
void write_atomic(const std::string& path, const std::string& content);

// fsyncs a folder so renames and new entries in it are durable (best effort where refused).
void sync_folder(const std::string& path);

// Creates the folder and its parents; throws loom::IoError when that fails.
void create_directories(const std::string& path);

}  // namespace loom::files

namespace loom::files {

// Refuses, before anything opens it, a path that is not a regular file (a folder, FIFO, socket
// or device: opening a FIFO would block forever). Follows symbolic links. `role` names the file
// in the error ("config file", "checkpoint index", ...). Throws loom::InputError.
void require_regular_file(const std::string& path, const std::string& role);

// The whole content of a regular file (require_regular_file first); files larger than
// `max_bytes` are refused. Throws loom::InputError naming the role and path.
std::string read_file(const std::string& path, const std::string& role,
                      uint64_t max_bytes = uint64_t{1} << 32);

// Whether `name` (a path taken from a file: an index entry, a weight map) stays inside its
// folder: relative, no "..", not empty.
bool is_contained_relative_path(const std::string& name);

// Where a job's output subfolder setting (metrics.save_tb_folder, checkpoint.folder, ...) points:
// an absolute path as given (as torchtitan's os.path.join does), a relative one inside
// `dump_folder`. A relative path that climbs out ("../x") is refused naming `key`
// (loom::InputError): it would write beside other runs' output.
std::string output_folder(const std::string& dump_folder, const std::string& value,
                          const std::string& key);

}  // namespace loom::files
