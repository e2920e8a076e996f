// Connecting to a c10d TCPStore with a deadline. c10d's client pings the server in its
// constructor and waits for the answer with no timeout of its own, so any program that accepts
// connections on the port and never answers would hold the caller forever, deaf to SIGTERM.
#pragma once

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <string>

namespace loom::distributed {

// A client of the store at `host`:options.port (options.isServer must be false), connected on a
// helper thread while this one waits at most options.timeout. Throws CommError naming `what`
// (e.g. "rendezvous store") and the address when the store does not answer in time or the
// connection fails; ends the process with 128 + the signal when SIGTERM or SIGINT arrives while
// it waits (nothing has started yet that could be lost).
c10::intrusive_ptr<c10d::TCPStore> connect_store(const std::string& host,
                                                 const c10d::TCPStoreOptions& options,
                                                 const std::string& what);

// Ends the process with 128 + the signal (one line on stderr naming `what` at `address`) when
// SIGTERM or SIGINT arrived: for waits before anything started that could be lost.
void exit_if_signalled_while_connecting(const std::string& what, const std::string& address);

}  // namespace loom::distributed
