#include "loom/distributed/store_connect.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <future>
#include <memory>
#include <thread>

#include "backend.h"
#include "loom/core/check.h"
#include "loom/core/signals.h"
#include "loom/distributed/comm.h"

namespace loom::distributed {

void exit_if_signalled_while_connecting(const std::string& what, const std::string& address) {
  if (!signals::shutdown_requested()) return;
  const int sig = signals::shutdown_signal();
  std::fprintf(stderr, "loom: signal %d while connecting to the %s at %s: exiting\n", sig,
               what.c_str(), address.c_str());
  std::fflush(stderr);
  std::_Exit(128 + sig);
}

c10::intrusive_ptr<c10d::TCPStore> connect_store(const std::string& host,
                                                 const c10d::TCPStoreOptions& options,
                                                 const std::string& what) {
  LOOM_CHECK(!options.isServer, "connect_store makes clients only");
  const std::string address = host + ":" + std::to_string(options.port);
  // The thread owns its promise: when the wait gives up, it is left behind (blocked in c10d's
  // ping) and ends with the process, touching only what it owns.
  auto promise = std::make_shared<std::promise<c10::intrusive_ptr<c10d::TCPStore>>>();
  auto future = promise->get_future();
  std::thread([promise, host, options] {
    try {
      promise->set_value(c10::make_intrusive<c10d::TCPStore>(host, options));
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  }).detach();
  // c10d's connect retries until its own timeout; the answer to its ping gets as long again (at
  // most 5 s more).
  const auto wait = options.timeout +
                    std::min<std::chrono::milliseconds>(options.timeout, std::chrono::seconds(5));
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (future.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    exit_if_signalled_while_connecting(what, address);
    LOOM_CHECK_AS(CommError, std::chrono::steady_clock::now() < deadline, "the ", what, " at ",
                  address, " accepted the connection but did not answer within ",
                  std::chrono::duration_cast<std::chrono::seconds>(wait).count(),
                  " s: is another program listening on that port? (check the address, and that "
                  "the port is free before the job starts)");
  }
  try {
    return future.get();
  } catch (const std::exception& e) {
    LOOM_THROW(CommError, "cannot reach the ", what, " at ", address, ": ", message_of(e));
  }
}

}  // namespace loom::distributed
