// This machine's memory, without LibTorch: what a size is checked against before it is allocated
// (the host-side halves of loom: schedules, tables built on the CPU).
#pragma once

#include <string>

namespace loom::host {

// Physical memory, or the cgroup's (v2 or v1) limit when lower; 0 when unknown.
double memory_bytes();

// Throws InputError "`what` needs N GiB of host memory, which has M GiB; `remedy`" when `bytes`
// exceed memory_bytes() (never when it is unknown).
void check_fits(double bytes, const std::string& what, const std::string& remedy);

// "12.5": bytes in GiB with three significant digits, for such messages.
std::string gib(double bytes);

}  // namespace loom::host
