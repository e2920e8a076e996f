#include "loom/core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <map>
#include <mutex>

#include "loom/core/check.h"
#include "loom/core/env.h"

namespace loom::log {
namespace {

struct Registry {
  std::mutex mutex;
  std::shared_ptr<spdlog::sinks::stderr_color_sink_mt> sink =
      std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  std::map<std::string, std::shared_ptr<spdlog::logger>, std::less<>> loggers;
  spdlog::level::level_enum level = spdlog::level::info;
  int rank = 0;
  bool initialized = false;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

std::string pattern_for(int rank) {
  return "[%Y-%m-%d %H:%M:%S.%e] [rank" + std::to_string(rank) + "] [%n] %^%l%$: %v";
}

void configure(spdlog::logger& logger, const Registry& reg) {
  logger.set_level(reg.level);
  logger.set_pattern(pattern_for(reg.rank));
  logger.flush_on(spdlog::level::warn);
}

void init_locked(Registry& reg, int rank) {
  reg.rank = rank;
  reg.level = spdlog::level::info;
  std::string bad_level;
  if (auto value = env::get("LOOM_LOG_LEVEL")) {
    try {
      reg.level = parse_level(*value);
    } catch (const InputError&) {
      bad_level = *value;
    }
  }
  reg.initialized = true;
  for (auto& [name, logger] : reg.loggers) {
    configure(*logger, reg);
  }
  if (!bad_level.empty()) {
    auto logger = std::make_shared<spdlog::logger>("logging", reg.sink);
    configure(*logger, reg);
    logger->warn(
        "LOOM_LOG_LEVEL='{}' is not a level (trace, debug, info, warn, error, critical, "
        "off); using info",
        bad_level);
  }
}

}  // namespace

spdlog::level::level_enum parse_level(std::string_view name) {
  static const std::map<std::string_view, spdlog::level::level_enum> levels = {
      {"trace", spdlog::level::trace},       {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},         {"warn", spdlog::level::warn},
      {"warning", spdlog::level::warn},      {"error", spdlog::level::err},
      {"critical", spdlog::level::critical}, {"off", spdlog::level::off}};
  auto it = levels.find(name);
  LOOM_CHECK_AS(InputError, it != levels.end(), "LOOM_LOG_LEVEL: unknown level '", name,
                "' (expected trace, debug, info, warn, error, critical or off)");
  return it->second;
}

void init(int rank) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  init_locked(reg, rank);
}

std::shared_ptr<spdlog::logger> get(std::string_view component) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  if (!reg.initialized) {
    init_locked(reg, env::get_int("RANK").value_or(0));
  }
  auto it = reg.loggers.find(component);
  if (it != reg.loggers.end()) {
    return it->second;
  }
  auto logger = std::make_shared<spdlog::logger>(std::string(component), reg.sink);
  configure(*logger, reg);
  reg.loggers.emplace(std::string(component), logger);
  return logger;
}

}  // namespace loom::log
