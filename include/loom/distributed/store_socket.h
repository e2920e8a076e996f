// The socket rank 0's rendezvous store (c10d TCPStore) listens on. TCPStore on its own binds
// every interface, and the store is unauthenticated: anyone who reaches the port can read and
// write rendezvous keys. loom binds it to MASTER_ADDR's own address instead: loopback for a
// single-node job (127.0.0.1, localhost, ::1), the named interface for a multi-node one.
#pragma once

#include <optional>
#include <string>

namespace loom::distributed {

// Whether `host` names the loopback interface (127.0.0.0/8, ::1, localhost).
bool is_loopback_host(const std::string& host);

// A TCP socket bound to `host`:`port` and listening, for TCPStoreOptions::masterListenFd; nullopt
// (with a warning) when `host` is not an address of this machine, in which case the store binds
// every interface as c10d does by default.
std::optional<int> bind_store_socket(const std::string& host, int port);

}  // namespace loom::distributed
