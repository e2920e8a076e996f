// Admission in front of a c10d TCPStore. c10d's store authenticates nobody: whoever reaches its
// port reads and writes every key (a replica group's model state travels over connections its
// keys set up). So a store that must admit only its job listens on loopback, on a port of its
// own, and an AuthGate owns the public port: it admits a connection after a challenge-response
// on the job secret (job_secret.h), then relays bytes both ways between it and the store.
//
//   gate   -> client  "LOOMGATE1", mode ('S': secret required, 'O': open), nonce_s (32 bytes)
//   client -> gate    nonce_c (32 bytes), HMAC(K, "loom-client" nonce_s nonce_c)       [S only]
//   gate   -> client  'Y' + HMAC(K, "loom-server" nonce_s nonce_c), or 'N' and close    [S only]
//
// The secret never crosses the wire and both nonces are fresh, so a recorded handshake replays
// nowhere; the gate proves the secret back, so a worker cannot be answered by an impostor
// lighthouse. What it does not give (docs/fault_tolerance.md, threat model): secrecy or integrity
// of the bytes after the handshake (an attacker on the path can read or hijack them; run the
// control plane on a private network), and protection from a process that holds the secret.
//
// The gate also bounds what a stranger can hold: a handshake has a deadline, and connections
// are bounded per peer address and in total.
//
// c10d's TCPStore client cannot speak the handshake, so a client goes through an AuthTunnel:
// a loopback listener of its own that admits only connections from this very process (the peer
// socket must be one of this process's file descriptors) and relays each to the gate once its
// own handshake succeeded.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "loom/distributed/job_secret.h"

namespace loom::distributed {

struct GateOptions {
  std::string host = "127.0.0.1";  // must be an address of this host (or a wildcard)
  int port = 0;                    // 0: any free port
  JobSecret secret;                // empty: open (every connection admitted; warns)
  int backend_port = 0;            // the store's port on 127.0.0.1
  int listen_fd = -1;  // a socket already listening (host/port then only name it); -1: bind here
  std::chrono::milliseconds handshake_timeout{5000};
  // A group holds one connection per rank (two on its first rank): these bound a stranger's
  // share, not a job's (thousands of ranks behind one address would need more).
  int max_per_peer = 256;
  int max_connections = 4096;
  std::string what = "lighthouse";  // for logs
  bool warn_when_open = true;       // log that an empty secret admits anyone
};

// Handshake failures on the client side: refused (wrong or missing secret, open gate while the
// client holds a secret) is an InputError, one line; nothing answering is an IoError.
class AuthGate {
 public:
  // Binds and starts admitting; InputError naming host:port when `host` is not an address of
  // this machine or the port is taken.
  explicit AuthGate(GateOptions options);
  ~AuthGate();
  AuthGate(const AuthGate&) = delete;
  AuthGate& operator=(const AuthGate&) = delete;

  int port() const { return port_; }
  int64_t admitted() const;
  int64_t refused() const;  // wrong secret, handshake timeout, over a connection bound

  struct Shared;

 private:
  GateOptions options_;
  int port_ = 0;
  std::shared_ptr<Shared> shared_;
  std::thread acceptor_;
};

// What a client's errors call the server behind the gate, and where the client's secret comes
// from (the advice when the gate asks for a secret the client lacks).
struct GateNames {
  std::string server = "lighthouse";
  std::string secret_hint =
      "set TORCHFT_LIGHTHOUSE to the value `loom lighthouse` printed (HOST:PORT?secret_file=PATH "
      "or ?secret=HEX)";
};

class AuthTunnel {
 public:
  // Proves the secret to the gate at host:port once (InputError when refused, IoError when
  // nothing answers within `timeout`), then listens on 127.0.0.1. `address` names the gate in
  // errors (redacted of any secret).
  AuthTunnel(const std::string& host, int port, JobSecret secret, const std::string& address,
             std::chrono::milliseconds timeout, GateNames names = {});
  ~AuthTunnel();
  AuthTunnel(const AuthTunnel&) = delete;
  AuthTunnel& operator=(const AuthTunnel&) = delete;

  int local_port() const { return local_port_; }
  // Closes every connection through the tunnel and stops admitting new ones: a c10d operation
  // blocked on a gate that stopped answering (a SIGSTOPped lighthouse; c10d's reads have no
  // deadline of their own) then fails at once.
  void shut();

 private:
  std::string host_;
  int port_ = 0;
  int local_port_ = 0;
  std::shared_ptr<AuthGate::Shared> shared_;
  std::thread acceptor_;
};

// Binds a listening TCP socket to `host`:`port` (port 0: any), throwing InputError naming
// `flag` when `host` is not an address of this machine (EADDRNOTAVAIL: it would have to be
// reached through some other host) or the port is taken. Returns the fd; `bound_port` gets the
// port.
int listen_on_local_address(const std::string& host, int port, const std::string& flag,
                            int& bound_port);

}  // namespace loom::distributed
