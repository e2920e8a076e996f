// Rank-aware logging on spdlog. Every line carries the rank and a [component] prefix:
//   [2026-11-29 14:03:07.512] [rank0] [config] info: loaded configs/llama3_debug.toml
// The level comes from LOOM_LOG_LEVEL (trace, debug, info, warn, error, critical, off).
#pragma once

#include <spdlog/logger.h>

#include <memory>
#include <string>
#include <string_view>

namespace loom::log {

// Sets the rank shown in every line and the level from LOOM_LOG_LEVEL. Safe to call again (e.g.
// once the rank is known); loggers created earlier pick up the change.
void init(int rank);

// The logger of one component ("config", "trainer", "checkpoint", ...), created on first use.
std::shared_ptr<spdlog::logger> get(std::string_view component);

// Parses a level name; throws loom::InputError naming LOOM_LOG_LEVEL for an unknown one.
spdlog::level::level_enum parse_level(std::string_view name);

}  // namespace loom::log
