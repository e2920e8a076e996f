#pragma once
// stub: base class of ProcessGroupGloo::GlooStore (which only libtorch
// instantiates). GLOO_STORE_HAS_STORE_V2 is deliberately NOT defined, so the
// header declares only the four v1 overrides below.
#include <chrono>
#include <string>
#include <vector>
namespace gloo {
namespace rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& /*timeout*/) {
    wait(keys);
  }
};
} // namespace rendezvous
} // namespace gloo
