// Constructs c10d's Gloo backend. The only file that includes ProcessGroupGloo.hpp, with the
// declaration-only gloo headers of gloo_decls/ (see its README.md).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "backend.h"
#include "loom/core/env.h"

namespace loom::distributed {
namespace {

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// GLOO_SOCKET_IFNAME (torch's variable) picks the interface; a loopback master means every rank
// is on this machine, so bind to loopback; otherwise the address this host name resolves to.
std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr) {
  if (auto ifname = env::get("GLOO_SOCKET_IFNAME"); ifname && !ifname->empty()) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(*ifname);
  }
  if (is_loopback(master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

std::shared_ptr<Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout,
                                           const std::string& master_addr) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(gloo_device(master_addr));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  return std::make_shared<Backend>("gloo", gloo);
}

}  // namespace loom::distributed
