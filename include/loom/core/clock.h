// Wall-clock time as Unix seconds: the timestamps of metrics rows, event files and hang reports.
#pragma once

#include <chrono>

namespace loom {

inline double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace loom
