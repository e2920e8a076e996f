#include "loom/distributed/store_socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "loom/core/check.h"
#include "loom/core/logging.h"

namespace loom::distributed {
namespace {

// A socket bound to the first address `host` resolves to that takes `port` (listening when
// `listen`); -1 when none does, with the last failure's errno in `error`.
int bind_first(const std::string& host, int port, bool listen, int& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int resolved = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  LOOM_CHECK_AS(IoError, resolved == 0, "MASTER_ADDR '", host,
                "' does not resolve: ", ::gai_strerror(resolved));
  error = 0;
  int bound = -1;
  for (addrinfo* a = found; a != nullptr && bound < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // A port left in TIME_WAIT by a previous attempt is free; one with a listener is not.
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && (!listen || ::listen(fd, 1024) == 0)) {
      bound = fd;
    } else {
      error = errno;
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  return bound;
}

[[noreturn]] void throw_port_in_use(const std::string& host, int port) {
  LOOM_THROW(InputError, "port ", port, " on ", host,
             " is already in use (another job's rendezvous store?): ", busy_port_advice());
}

}  // namespace

std::string busy_port_advice() {
  return "pass --standalone to pick a free port, or another --master-port";
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  return ::inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

std::optional<int> bind_store_socket(const std::string& host, int port) {
  int error = 0;
  const int fd = bind_first(host, port, /*listen=*/true, error);
  if (fd >= 0) return fd;
  if (error == EADDRINUSE) throw_port_in_use(host, port);
  LOOM_CHECK_AS(IoError, !is_loopback_host(host), "cannot bind the rendezvous store to ", host, ":",
                port, ": ", std::strerror(error));
  log::get("comm")->warn(
      "MASTER_ADDR {} is not an address of this machine ({}): the rendezvous store listens on "
      "every interface; keep port {} on a private network",
      host, std::strerror(error), port);
  return std::nullopt;
}

void check_store_port_free(const std::string& host, int port) {
  int error = 0;
  const int fd = bind_first(host, port, /*listen=*/false, error);
  if (fd >= 0) {
    ::close(fd);
    return;
  }
  if (error == EADDRINUSE) throw_port_in_use(host, port);
}

}  // namespace loom::distributed
