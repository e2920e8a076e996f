// A c10d TCPStore that admits only the job's own processes. c10d's store authenticates nobody:
// whoever reaches its port reads every rendezvous key (and so the addresses model state travels
// to) and can write any. So loom's stores listen on loopback only, an AuthGate (auth_gate.h)
// owns the public HOST:PORT, and every client reaches it through an AuthTunnel of its own
// process. With a job secret (job_secret.h) the gate admits only connections that prove they
// hold it; without one it admits any loom client (the open gate of `--insecure`), and a client
// holding a secret refuses it. Either way a process without the secret learns at once, in one
// line, that the store asks for one, and a plain c10d client cannot speak to it.
#pragma once

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <memory>
#include <string>

#include "loom/distributed/auth_gate.h"

namespace loom::distributed {

struct SecuredStoreOptions {
  std::string host;  // the public address: hosted on its interface, or dialled
  int port = 0;
  JobSecret secret;  // empty: an open gate
  // timeout, numWorkers, ...: as for any TCPStore (port, isServer and the listening socket are
  // set here). A client waits up to `timeout` for the store to come up.
  c10d::TCPStoreOptions store;
  GateNames names;  // names.server: "rendezvous store", "elastic rendezvous store", ...
};

class SecuredStore {
 public:
  // Hosts the store at host:port. InputError naming the port when something listens there
  // (busy_port_advice()).
  static std::unique_ptr<SecuredStore> host(const SecuredStoreOptions& options);
  // A client of the store hosted at host:port. InputError (one line) when the gate refuses this
  // process's secret or lack of one; CommError when nothing answers within options.store.timeout;
  // ends the process with 128 + the signal on SIGTERM/SIGINT while it waits (as connect_store).
  static std::unique_ptr<SecuredStore> connect(const SecuredStoreOptions& options);
  // A client of a store that is not loom's (torchrun's agent store): c10d's plain connection,
  // no gate, no secret (connect_store's deadline).
  static std::unique_ptr<SecuredStore> connect_plain(const SecuredStoreOptions& options);
  ~SecuredStore();
  SecuredStore(const SecuredStore&) = delete;
  SecuredStore& operator=(const SecuredStore&) = delete;

  const c10::intrusive_ptr<c10d::TCPStore>& store() const { return store_; }

 private:
  SecuredStore() = default;
  // Declared before the store: destroyed after it, so its connections close first.
  std::unique_ptr<AuthGate> gate_;
  std::unique_ptr<AuthTunnel> tunnel_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

}  // namespace loom::distributed
