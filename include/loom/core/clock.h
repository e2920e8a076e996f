// Wall-clock time as Unix seconds (the timestamps of metrics rows, event files and hang reports),
// and seconds elapsed on the steady clock (durations: steps, waits, checkpoint writes).
#pragma once

#include <chrono>

namespace loom {

inline double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace loom
