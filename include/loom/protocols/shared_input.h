// An activation that several layers read in a row (attention's q, k and v projections of x; the
// feed-forward's w1 and w3): inside a SharedInputScope the model declares it, and a layer's
// compute may keep what it derives from it (float8: its cast) for the scope's other readers,
// under a key of its own. Everything kept goes when the scope ends, so nothing outlives the
// block's forward; the models stay unaware of what is kept (quantize/ keeps casts).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>

namespace loom::models {

class SharedInputScope {
 public:
  explicit SharedInputScope(const at::Tensor& input);
  ~SharedInputScope();
  SharedInputScope(const SharedInputScope&) = delete;
  SharedInputScope& operator=(const SharedInputScope&) = delete;

 private:
  friend std::shared_ptr<void> shared_input_value(const at::Tensor&, const std::string&);
  friend bool keep_shared_input_value(const at::Tensor&, const std::string&, std::shared_ptr<void>);
  // The innermost open scope of this thread declared for `input`, or null.
  static SharedInputScope* declared_for(const at::Tensor& input);
  const at::Tensor& input_;
  int64_t version_;
  std::map<std::string, std::shared_ptr<void>> kept_;
  SharedInputScope* outer_;
};

// What a reader kept under `key` for `input` in an open scope of this thread declared for that
// very tensor (same object, unchanged since), or null.
std::shared_ptr<void> shared_input_value(const at::Tensor& input, const std::string& key);
// Keeps `value` for the scope's other readers; false (nothing kept) when no open scope was
// declared for `input`.
bool keep_shared_input_value(const at::Tensor& input, const std::string& key,
                             std::shared_ptr<void> value);

}  // namespace loom::models
