#include "loom/data/prefetch.h"

#include "loom/core/check.h"

namespace loom::data {

PrefetchingSource::PrefetchingSource(std::unique_ptr<BatchSource> source, int64_t batch_size,
                                     int64_t seq_len, int64_t depth)
    : source_(std::move(source)),
      batch_size_(batch_size),
      seq_len_(seq_len),
      depth_(static_cast<size_t>(std::max<int64_t>(depth, 1))) {
  consumed_state_ = source_->state();
  consumed_skipped_ = source_->records_skipped();
  start();
}

PrefetchingSource::~PrefetchingSource() {
  stop();
}

void PrefetchingSource::start() {
  stopping_ = false;
  thread_ = std::thread([this] { run(); });
}

void PrefetchingSource::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  queue_.clear();
  error_ = nullptr;
}

void PrefetchingSource::run() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return stopping_ || queue_.size() < depth_; });
      if (stopping_) return;
    }
    try {
      Batch batch = source_->next(batch_size_, seq_len_);
      nlohmann::json state = source_->state();
      const int64_t skipped = source_->records_skipped();
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back({std::move(batch), std::move(state), skipped});
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
      changed_.notify_all();
      return;
    }
    changed_.notify_all();
  }
}

Batch PrefetchingSource::next(int64_t batch_size, int64_t seq_len) {
  LOOM_CHECK(batch_size == batch_size_ && seq_len == seq_len_, "prefetching source made for ",
             batch_size_, " x ", seq_len_, ", asked for ", batch_size, " x ", seq_len);
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return !queue_.empty() || error_; });
  if (queue_.empty()) std::rethrow_exception(error_);
  Ready ready = std::move(queue_.front());
  queue_.pop_front();
  consumed_state_ = std::move(ready.state_after);
  consumed_skipped_ = ready.skipped_after;
  lock.unlock();
  changed_.notify_all();
  return std::move(ready.batch);
}

nlohmann::json PrefetchingSource::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return consumed_state_;
}

int64_t PrefetchingSource::records_skipped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return consumed_skipped_;
}

void PrefetchingSource::load_state(const nlohmann::json& state) {
  stop();
  try {
    source_->load_state(state);
  } catch (...) {
    // The source may have changed part of itself before refusing: back to the consumer's place.
    // (The thread stayed stopped, and the next next() waited forever.)
    try {
      source_->load_state(consumed_state_);
    } catch (...) {
      // The error that matters is the first: it goes up.
    }
    start();
    throw;
  }
  consumed_state_ = source_->state();
  consumed_skipped_ = source_->records_skipped();
  start();
}

}  // namespace loom::data
