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

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  return ::inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

std::optional<int> bind_store_socket(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int resolved = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  LOOM_CHECK_AS(IoError, resolved == 0, "MASTER_ADDR '", host,
                "' does not resolve: ", ::gai_strerror(resolved));
  std::string why;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      ::freeaddrinfo(found);
      return fd;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  LOOM_CHECK_AS(IoError, !is_loopback_host(host), "cannot bind the rendezvous store to ", host, ":",
                port, ": ", why);
  log::get("comm")->warn(
      "MASTER_ADDR {} is not an address of this machine ({}): the rendezvous store listens on "
      "every interface; keep port {} on a private network",
      host, why, port);
  return std::nullopt;
}

}  // namespace loom::distributed
