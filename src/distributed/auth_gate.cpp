#include "loom/distributed/auth_gate.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/rand.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/core/rate_limited_log.h"

namespace loom::distributed {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct AuthGate::Shared {
  std::atomic<bool> stop{false};
  std::atomic<int> active{0};  // connection threads alive
  std::atomic<int64_t> admitted{0}, refused{0};
  std::mutex mutex;
  std::map<std::string, int> per_peer;  // open connections by peer address
  int total = 0;
  log::RateLimitedWarning warning{"auth"};
};

namespace {

constexpr char kMagic[] = "LOOMGATE1";  // 9 bytes on the wire
constexpr size_t kMagicBytes = sizeof(kMagic) - 1;
constexpr size_t kNonce = 32;
constexpr size_t kHello = kMagicBytes + 1 + kNonce;

// Closes its descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = o.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// Waits until `fd` is ready for `events` (at most until `deadline`, and while !stop).
bool wait_ready(int fd, short events, Clock::time_point deadline, const std::atomic<bool>& stop) {
  while (!stop) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 100)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
  return false;
}

bool read_exact(int fd, void* data, size_t size, Clock::time_point deadline,
                const std::atomic<bool>& stop) {
  auto* out = static_cast<char*>(data);
  while (size > 0) {
    if (!wait_ready(fd, POLLIN, deadline, stop)) return false;
    const ssize_t n = ::recv(fd, out, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    out += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool write_all(int fd, const void* data, size_t size) {
  const auto* in = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, in, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    in += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Bytes both ways until either side closes or the gate stops.
void relay(int a, int b, const std::atomic<bool>& stop) {
  char buffer[65536];
  pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
  while (!stop) {
    const int n = ::poll(fds, 2, 100);
    if (n < 0 && errno != EINTR) return;
    for (int i = 0; i < 2 && n > 0; ++i) {
      if (fds[i].revents == 0) continue;
      const ssize_t got = ::recv(fds[i].fd, buffer, sizeof(buffer), 0);
      if (got <= 0) return;
      if (!write_all(fds[1 - i].fd, buffer, static_cast<size_t>(got))) return;
    }
  }
}

std::string nonce() {
  std::string n(kNonce, '\0');
  LOOM_CHECK_AS(IoError, RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), kNonce) == 1,
                "cannot draw a nonce: OpenSSL's random generator has no entropy");
  return n;
}

std::string proof(const JobSecret& secret, const char* role, const std::string& server_nonce,
                  const std::string& client_nonce) {
  const Digest d = hmac_sha256(secret, role + server_nonce + client_nonce);
  return {d.begin(), d.end()};
}

bool same(const std::string& a, const std::string& b) {
  Digest x{}, y{};
  if (a.size() != x.size() || b.size() != y.size()) return false;
  std::memcpy(x.data(), a.data(), x.size());
  std::memcpy(y.data(), b.data(), y.size());
  return same_digest(x, y);
}

// The gate's half; true when the client proved the secret (or the gate is open).
bool admit(int fd, const JobSecret& secret, milliseconds timeout, const std::atomic<bool>& stop) {
  const std::string server_nonce = nonce();
  const std::string hello = std::string(kMagic) + (secret.empty() ? 'O' : 'S') + server_nonce;
  if (!write_all(fd, hello.data(), hello.size())) return false;
  if (secret.empty()) return true;
  std::string answer(2 * kNonce, '\0');
  if (!read_exact(fd, answer.data(), answer.size(), Clock::now() + timeout, stop)) return false;
  const std::string client_nonce = answer.substr(0, kNonce);
  if (!same(answer.substr(kNonce), proof(secret, "loom-client", server_nonce, client_nonce))) {
    write_all(fd, "N", 1);
    return false;
  }
  const std::string verdict = "Y" + proof(secret, "loom-server", server_nonce, client_nonce);
  return write_all(fd, verdict.data(), verdict.size());
}

// The client's half; throws what a worker should read (one line).
void prove(int fd, const JobSecret& secret, const std::string& address, const GateNames& names,
           Clock::time_point deadline, const std::atomic<bool>& stop) {
  const std::string server = "the " + names.server + " at " + address;
  std::string hello(kHello, '\0');
  LOOM_CHECK_AS(IoError, read_exact(fd, hello.data(), hello.size(), deadline, stop), server,
                " accepted the connection but did not greet as a loom ", names.server, " in time");
  LOOM_CHECK_AS(InputError, hello.compare(0, kMagicBytes, kMagic) == 0, server,
                " answers but is not a loom ", names.server, " (or one older than the job secret)");
  const char mode = hello[kMagicBytes];
  if (mode == 'O') {
    LOOM_CHECK_AS(InputError, secret.empty(), server,
                  " admits anyone (started without a job secret, e.g. --insecure) while this "
                  "process holds one: it cannot prove it belongs to this job; drop the secret only "
                  "if you trust the network");
    return;
  }
  LOOM_CHECK_AS(InputError, !secret.empty(), server,
                " admits only workers holding the job secret: ", names.secret_hint);
  const std::string server_nonce = hello.substr(kMagicBytes + 1);
  const std::string client_nonce = nonce();
  const std::string answer =
      client_nonce + proof(secret, "loom-client", server_nonce, client_nonce);
  LOOM_CHECK_AS(IoError, write_all(fd, answer.data(), answer.size()), server,
                " closed the connection during the handshake");
  char verdict = 0;
  LOOM_CHECK_AS(InputError, read_exact(fd, &verdict, 1, deadline, stop) && verdict == 'Y', server,
                " refused this worker's job secret (a stale secret, or another job's ",
                names.server, " at that address?)");
  std::string server_proof(kNonce, '\0');
  LOOM_CHECK_AS(IoError, read_exact(fd, server_proof.data(), kNonce, deadline, stop), server,
                " closed the connection during the handshake");
  LOOM_CHECK_AS(InputError,
                same(server_proof, proof(secret, "loom-server", server_nonce, client_nonce)),
                server, " did not prove it holds the job secret: not this job's ", names.server);
}

int connect_to(const std::string& host, int port, Clock::time_point deadline,
               const std::atomic<bool>& stop, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int resolved = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (resolved != 0) {
    error = std::string("cannot resolve ") + host + ": " + ::gai_strerror(resolved);
    return -1;
  }
  int out = -1;
  for (addrinfo* a = found; a != nullptr && out < 0; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (fd.get() < 0) continue;
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      error = std::strerror(errno);
      continue;
    }
    if (!wait_ready(fd.get(), POLLOUT, deadline, stop)) {
      error = "no answer in time";
      continue;
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      error = std::strerror(so_error);
      continue;
    }
    ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
    out = fd.release();
  }
  ::freeaddrinfo(found);
  return out;
}

std::string peer_host(const sockaddr_storage& peer) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (peer.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(peer).sin_addr, text, sizeof(text));
  } else if (peer.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(peer).sin6_addr, text,
                sizeof(text));
  }
  return text;
}

// An IPv4 endpoint (address, port in network order) of `a`, also when it is written as an
// IPv4-mapped IPv6 address (c10d's client connects through an IPv6 socket: ::ffff:127.0.0.1).
std::optional<std::pair<uint32_t, uint16_t>> ipv4_endpoint(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    return std::make_pair(v4.sin_addr.s_addr, v4.sin_port);
  }
  if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    if (!IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr)) return std::nullopt;
    uint32_t addr = 0;
    std::memcpy(&addr, v6.sin6_addr.s6_addr + 12, sizeof(addr));
    return std::make_pair(addr, v6.sin6_port);
  }
  return std::nullopt;
}

// Whether the peer of a loopback connection is a socket of this very process: some descriptor
// of ours is bound to the peer's address and port.
bool from_this_process(const sockaddr_storage& peer) {
  const auto want = ipv4_endpoint(peer);
  if (!want) return false;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return false;
  bool found = false;
  while (dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    sockaddr_storage mine{};
    socklen_t len = sizeof(mine);
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&mine), &len) != 0) {
      continue;
    }
    if (ipv4_endpoint(mine) == want) {
      found = true;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

// Accepts on `listen_fd` until the shared stop flag, handing each connection to `handle` on a
// thread of its own (counted in `active`, so the owner can wait for them).
void accept_loop(int listen_fd, std::shared_ptr<AuthGate::Shared> shared,
                 std::function<void(Fd, sockaddr_storage, socklen_t)> handle) {
  Fd listener(listen_fd);
  while (!shared->stop) {
    pollfd p{listener.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    Fd fd(::accept4(listener.get(), reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC));
    if (fd.get() < 0) continue;
    ++shared->active;
    std::thread([shared, handle, peer, len, raw = fd.release()] {
      try {
        handle(Fd(raw), peer, len);
      } catch (const std::exception& e) {
        shared->warning.warn(std::string("auth: ") + e.what());
      }
      --shared->active;
    }).detach();
  }
}

// Waits (bounded) for connection threads to notice the stop flag.
void wait_for_threads(const AuthGate::Shared& shared) {
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (shared.active > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
}

}  // namespace

namespace {
int local_port_of(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(addr).sin6_port
                                          : reinterpret_cast<const sockaddr_in&>(addr).sin_port);
}
}  // namespace

int listen_on_local_address(const std::string& host, int port, const std::string& flag,
                            int& bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* found = nullptr;
  const int resolved = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  LOOM_CHECK_AS(InputError, resolved == 0, flag, ": '", host,
                "' does not resolve: ", ::gai_strerror(resolved));
  int error = 0;
  Fd bound;
  for (addrinfo* a = found; a != nullptr && bound.get() < 0; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) continue;
    const int on = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), 1024) == 0) {
      bound = std::move(fd);
    } else {
      error = errno;
    }
  }
  ::freeaddrinfo(found);
  LOOM_CHECK_AS(InputError, bound.get() >= 0 || error != EADDRNOTAVAIL, flag, ": ", host,
                " is not an address of this machine (listen on one of its own interfaces, e.g. "
                "127.0.0.1 for a one-host job)");
  LOOM_CHECK_AS(InputError, bound.get() >= 0 || error != EADDRINUSE, flag, ": port ", port, " on ",
                host, " is already in use (another lighthouse?): pick another port");
  LOOM_CHECK_AS(InputError, bound.get() >= 0, flag, ": cannot listen on ", host, ":", port, ": ",
                std::strerror(error));
  bound_port = local_port_of(bound.get());
  return bound.release();
}

// ---------------------------------------------------------------------------------------------
// AuthGate

AuthGate::AuthGate(GateOptions options)
    : options_(std::move(options)), shared_(std::make_shared<Shared>()) {
  int fd = options_.listen_fd;
  if (fd >= 0) {
    port_ = local_port_of(fd);
  } else {
    fd = listen_on_local_address(options_.host, options_.port, "--bind", port_);
  }
  if (options_.secret.empty() && options_.warn_when_open) {
    log::get("auth")->warn(
        "the {} at {}:{} admits anyone who reaches it (no job secret): any process on the "
        "network can read its keys, join its quorums and receive model state",
        options_.what, options_.host, port_);
  }
  auto handle = [o = options_, shared = shared_](Fd client, sockaddr_storage peer, socklen_t) {
    const std::string who = peer_host(peer);
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      if (shared->total >= o.max_connections || shared->per_peer[who] >= o.max_per_peer) {
        ++shared->refused;
        shared->warning.warn(fmt::format(
            "{}: refused a connection from {}: over the bound of {} connections per peer, {} in "
            "all",
            o.what, who, o.max_per_peer, o.max_connections));
        return;
      }
      ++shared->total;
      ++shared->per_peer[who];
    }
    struct Release {
      Shared& s;
      std::string who;
      ~Release() {
        std::lock_guard<std::mutex> lock(s.mutex);
        --s.total;
        if (--s.per_peer[who] == 0) s.per_peer.erase(who);
      }
    } release{*shared, who};
    if (!admit(client.get(), o.secret, o.handshake_timeout, shared->stop)) {
      ++shared->refused;
      shared->warning.warn(
          fmt::format("{}: refused a connection from {}: no proof of the job secret within {} ms",
                      o.what, who, o.handshake_timeout.count()));
      return;
    }
    ++shared->admitted;
    std::string error;
    Fd store(connect_to("127.0.0.1", o.backend_port, Clock::now() + std::chrono::seconds(5),
                        shared->stop, error));
    if (store.get() < 0) {
      shared->warning.warn(fmt::format("{}: its store does not answer: {}", o.what, error));
      return;
    }
    relay(client.get(), store.get(), shared->stop);
  };
  acceptor_ = std::thread(accept_loop, fd, shared_, handle);
}

AuthGate::~AuthGate() {
  shared_->stop = true;
  if (acceptor_.joinable()) acceptor_.join();
  wait_for_threads(*shared_);
}

int64_t AuthGate::admitted() const {
  return shared_->admitted;
}
int64_t AuthGate::refused() const {
  return shared_->refused;
}

// ---------------------------------------------------------------------------------------------
// AuthTunnel

AuthTunnel::AuthTunnel(const std::string& host, int port, JobSecret secret,
                       const std::string& address, milliseconds timeout, GateNames names)
    : host_(host), port_(port), shared_(std::make_shared<AuthGate::Shared>()) {
  {  // Once here, so a refusal reads as one line in the worker instead of a store error.
    std::string error;
    Fd probe(connect_to(host, port, Clock::now() + timeout, shared_->stop, error));
    LOOM_CHECK_AS(IoError, probe.get() >= 0, "nothing answers at ", address, ": ", error);
    prove(probe.get(), secret, address, names, Clock::now() + timeout, shared_->stop);
  }
  const int fd = listen_on_local_address("127.0.0.1", 0, "auth tunnel", local_port_);
  auto handle = [host, port, secret, address, timeout, names, shared = shared_](
                    Fd local, sockaddr_storage peer, socklen_t) {
    if (!from_this_process(peer)) {
      shared->warning.warn("auth tunnel to " + address +
                           ": refused a connection from another process");
      return;
    }
    std::string error;
    Fd remote(connect_to(host, port, Clock::now() + timeout, shared->stop, error));
    if (remote.get() < 0) {
      shared->warning.warn("auth tunnel: nothing answers at " + address + ": " + error);
      return;
    }
    prove(remote.get(), secret, address, names, Clock::now() + timeout, shared->stop);
    relay(local.get(), remote.get(), shared->stop);
  };
  acceptor_ = std::thread(accept_loop, fd, shared_, handle);
}

void AuthTunnel::shut() {
  shared_->stop = true;
}

AuthTunnel::~AuthTunnel() {
  shared_->stop = true;
  if (acceptor_.joinable()) acceptor_.join();
  wait_for_threads(*shared_);
}

}  // namespace loom::distributed
