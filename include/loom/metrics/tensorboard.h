// TensorBoard event files: TFRecord framing (length, masked CRC-32C of the length, payload,
// masked CRC-32C of the payload) around protobuf `Event` records with scalar `Summary` values.
// Written with libprotobuf from loom's own minimal schema (src/metrics/proto), which keeps the
// field numbers of TensorFlow's event.proto and summary.proto.
//
// Each writer opens a new file `events.out.tfevents.<unix time>.<host>.<pid>.<n>` in its folder,
// so a resumed run appends a file beside the earlier ones. Its first records are the file
// version and a SessionLog START at the first step this run computes: TensorBoard then drops
// what earlier files logged at or after that step (the steps a resumed run recomputes) and
// shows one continuous curve.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace loom::metrics {

class TensorBoardWriter {
 public:
  // Creates `folder` if needed. Throws loom::IoError when the file cannot be created.
  TensorBoardWriter(const std::string& folder, int64_t first_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event at `step` holding every scalar; written and flushed at once (a live TensorBoard
  // sees it, a crash loses nothing logged).
  void add_scalars(int64_t step, double wall_time,
                   const std::vector<std::pair<std::string, double>>& scalars);

  const std::string& path() const { return path_; }

  // One TFRecord around `payload`, as written to the file (for tests).
  static std::string frame_record(const std::string& payload);

 private:
  void write_record(const std::string& payload);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace loom::metrics
