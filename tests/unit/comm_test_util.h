// Runs one function per rank on threads of this process, each with its own ProcessGroups joined
// through a TCPStore on 127.0.0.1 (c10d's Gloo supports several groups per process). Failures
// inside a rank are collected and rethrown as one test failure.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/distributed/process_groups.h"
#include "loom/launch/world_info.h"
#include "support/process.h"

namespace loom::testing {

inline distributed::CommInit thread_rank_init(int rank, int world, int port,
                                              distributed::CommOptions options = {}) {
  distributed::CommInit init;
  init.rank = rank;
  init.world_size = world;
  init.master_addr = "127.0.0.1";
  init.master_port = port;
  init.options = options;
  return init;
}

// The launcher's view of thread rank `rank` of `world` on this host, for ParallelRuntime::for_world.
inline distributed::WorldInfo thread_rank_world(int rank, int world, int port) {
  distributed::WorldInfo info;
  info.rank = rank;
  info.world_size = world;
  info.local_world_size = world;
  info.master_port = port;
  return info;
}

// Calls body(rank) on `world` threads; returns the messages of exceptions the ranks threw.
inline std::vector<std::string> on_thread_ranks(int world, const std::function<void(int)>& body) {
  std::mutex mutex;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        errors.push_back("rank " + std::to_string(rank) + ": " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Calls body(groups) on `world` threads; returns the messages of exceptions the ranks threw.
inline std::vector<std::string> run_ranks(
    int world, const std::function<void(distributed::ProcessGroups&)>& body,
    distributed::CommOptions options = {}) {
  if (options.init_timeout > std::chrono::seconds(60))
    options.init_timeout = std::chrono::seconds(60);
  if (options.train_timeout > std::chrono::seconds(60)) {
    options.train_timeout = std::chrono::seconds(60);
  }
  const int port = free_port();
  return on_thread_ranks(world, [&](int rank) {
    distributed::ProcessGroups groups(thread_rank_init(rank, world, port, options));
    body(groups);
  });
}

inline std::string joined(const std::vector<std::string>& errors) {
  std::string text;
  for (const auto& e : errors) text += e + "\n";
  return text;
}

#define LOOM_EXPECT_RANKS_OK(errors) \
  EXPECT_TRUE((errors).empty()) << ::loom::testing::joined(errors)

}  // namespace loom::testing
