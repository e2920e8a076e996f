#include "loom/metrics/tensorboard.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "loom/core/check.h"
#include "loom/core/clock.h"
#include "loom/core/files.h"
#include "loom/metrics/crc32c.h"
#include "tensorboard_event.pb.h"

namespace loom::metrics {
namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// Unique within the folder even for two writers opened in the same second by one process.
std::string event_file_name() {
  static std::atomic<int> counter{0};
  const auto seconds = static_cast<long long>(now_unix());
  return "events.out.tfevents." + std::to_string(seconds) + "." + host_name() + "." +
         std::to_string(::getpid()) + "." + std::to_string(counter++);
}

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFFu));
}

}  // namespace

std::string TensorBoardWriter::frame_record(const std::string& payload) {
  std::string header;
  put_le(header, payload.size(), 8);
  std::string record = header;
  put_le(record, masked_crc32c(header.data(), header.size()), 4);
  record += payload;
  put_le(record, masked_crc32c(payload.data(), payload.size()), 4);
  return record;
}

TensorBoardWriter::TensorBoardWriter(const std::string& folder, int64_t first_step) {
  files::create_directories(folder);
  path_ = folder + "/" + event_file_name();
  file_ = std::fopen(path_.c_str(), "wb");
  LOOM_CHECK_AS(IoError, file_ != nullptr, "cannot create TensorBoard event file '", path_,
                "': ", std::strerror(errno));
  tensorboard::Event version;
  version.set_wall_time(now_unix());
  version.set_file_version("brain.Event:2");
  write_record(version.SerializeAsString());
  tensorboard::Event start;
  start.set_wall_time(now_unix());
  start.set_step(first_step);
  start.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  write_record(start.SerializeAsString());
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step, double wall_time,
                                    const std::vector<std::pair<std::string, double>>& scalars) {
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  auto* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    auto* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  write_record(event.SerializeAsString());
}

void TensorBoardWriter::write_record(const std::string& payload) {
  const std::string record = frame_record(payload);
  const bool ok = std::fwrite(record.data(), 1, record.size(), file_) == record.size() &&
                  std::fflush(file_) == 0;
  LOOM_CHECK_AS(IoError, ok, "cannot write TensorBoard event file '", path_,
                "': ", std::strerror(errno));
}

}  // namespace loom::metrics
