// Prefetching: a background thread keeps the next batches ready so the training loop never waits
// for tokenization, packing or copies. Batches come out in exactly the order the wrapped source
// makes them; state() is the source's position after the last batch handed out (not after the
// ones still queued), so a checkpoint resumes exactly. An error in the thread is rethrown by
// next().
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "loom/data/batch_source.h"

namespace loom::data {

class PrefetchingSource : public BatchSource {
 public:
  // Every next() call must ask for the same shape (the thread prepares that shape ahead).
  PrefetchingSource(std::unique_ptr<BatchSource> source, int64_t batch_size, int64_t seq_len,
                    int64_t depth = 2);
  ~PrefetchingSource() override;
  PrefetchingSource(const PrefetchingSource&) = delete;
  PrefetchingSource& operator=(const PrefetchingSource&) = delete;

  Batch next(int64_t batch_size, int64_t seq_len) override;
  std::optional<int64_t> samples_per_epoch() const override { return source_->samples_per_epoch(); }
  // As of the last batch handed out (the thread reads ahead).
  int64_t records_skipped() const override;
  nlohmann::json state() const override;
  // Stops the thread, drops queued batches, restores the source, starts again. When the source
  // refuses `state`, it goes back to where it stood and prefetches on before the error goes up.
  void load_state(const nlohmann::json& state) override;

 private:
  struct Ready {
    Batch batch;
    nlohmann::json state_after;  // the source's state once this batch was made
    int64_t skipped_after = 0;   // and its count of skipped records
  };
  void start();
  void stop();
  void run();

  std::unique_ptr<BatchSource> source_;
  int64_t batch_size_;
  int64_t seq_len_;
  size_t depth_;
  nlohmann::json consumed_state_;  // state after the last batch handed out
  int64_t consumed_skipped_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Ready> queue_;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace loom::data
