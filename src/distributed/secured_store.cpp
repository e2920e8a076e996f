#include "loom/distributed/secured_store.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/distributed/comm.h"
#include "loom/distributed/store_connect.h"
#include "loom/distributed/store_socket.h"

namespace loom::distributed {

namespace {
std::string address_of(const SecuredStoreOptions& o) {
  return o.host + ":" + std::to_string(o.port);
}
}  // namespace

std::unique_ptr<SecuredStore> SecuredStore::host(const SecuredStoreOptions& o) {
  std::unique_ptr<SecuredStore> out(new SecuredStore);
  // HOST's own interface (a busy port is an InputError here); nullopt: HOST is not this
  // machine's address, so every interface (store_socket.h warned).
  const std::optional<int> public_fd = bind_store_socket(o.host, o.port);
  int store_port = 0;
  const int store_fd = listen_on_local_address("127.0.0.1", 0, o.names.server, store_port);
  GateOptions gate;
  gate.host = o.host;
  gate.port = o.port;
  gate.secret = o.secret;
  gate.backend_port = store_port;
  gate.what = o.names.server;
  gate.warn_when_open = false;  // the launcher says it, once per job
  try {
    gate.listen_fd = public_fd
                         ? *public_fd
                         : listen_on_local_address("0.0.0.0", o.port, o.names.server, gate.port);
    out->gate_ = std::make_unique<AuthGate>(gate);
  } catch (...) {
    ::close(store_fd);
    throw;
  }
  c10d::TCPStoreOptions store = o.store;
  store.isServer = true;
  store.port = static_cast<std::uint16_t>(store_port);
  store.masterListenFd = store_fd;
  out->store_ = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store);
  if (!o.secret.empty()) {
    log::get("comm")->info("the {} at {} admits only holders of the job secret", o.names.server,
                           address_of(o));
  }
  return out;
}

std::unique_ptr<SecuredStore> SecuredStore::connect(const SecuredStoreOptions& o) {
  using Clock = std::chrono::steady_clock;
  std::unique_ptr<SecuredStore> out(new SecuredStore);
  const std::string address = address_of(o);
  // The host may not listen yet: dial until the store's own timeout, as c10d's client does.
  const auto deadline = Clock::now() + o.store.timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      out->tunnel_ = std::make_unique<AuthTunnel>(
          o.host, o.port, o.secret, address,
          std::max<std::chrono::milliseconds>(left, std::chrono::seconds(1)), o.names);
      break;
    } catch (const IoError& e) {
      LOOM_CHECK_AS(CommError, Clock::now() < deadline, "cannot reach the ", o.names.server, " at ",
                    address, " within ",
                    std::chrono::duration_cast<std::chrono::seconds>(o.store.timeout).count(),
                    " s: ", e.message());
      exit_if_signalled_while_connecting(o.names.server, address);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  c10d::TCPStoreOptions store = o.store;
  store.isServer = false;
  store.port = static_cast<std::uint16_t>(out->tunnel_->local_port());
  out->store_ = connect_store("127.0.0.1", store, o.names.server);
  return out;
}

std::unique_ptr<SecuredStore> SecuredStore::connect_plain(const SecuredStoreOptions& o) {
  std::unique_ptr<SecuredStore> out(new SecuredStore);
  c10d::TCPStoreOptions store = o.store;
  store.isServer = false;
  store.port = static_cast<std::uint16_t>(o.port);
  out->store_ = connect_store(o.host, store, o.names.server);
  return out;
}

SecuredStore::~SecuredStore() {
  // c10d's client may sit in a read that has no deadline: close the tunnel's relays under it.
  if (tunnel_) tunnel_->shut();
}

}  // namespace loom::distributed
