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
// every interface as c10d does by default. A port something else listens on throws InputError
// naming the port and the launcher flags that pick another.
std::optional<int> bind_store_socket(const std::string& host, int port);

// Throws InputError (one line naming the port and --standalone / --master-port) when something
// already listens on `host`:`port`, typically another job's store. The launcher asks before it
// starts any worker, so a busy port fails at once instead of in every rank. An address that is
// not this machine's is not checked (rank 0 then listens on every interface).
void check_store_port_free(const std::string& host, int port);

// The sentence every "port in use" error ends with: how to pick another port.
std::string busy_port_advice();

}  // namespace loom::distributed
