#include "loom/distributed/flight_recorder.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <csignal>
#include <filesystem>

#include "loom/core/check.h"
#include "loom/core/clock.h"
#include "loom/core/files.h"
#include "loom/core/logging.h"

namespace loom::distributed {
namespace {

std::atomic<uint64_t> g_dump_signals{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the signal counter must be lock-free");

extern "C" void on_dump_signal(int) {
  g_dump_signals.fetch_add(1);
}

nlohmann::json to_json(const CollectiveRecord& r) {
  auto time_or_null = [](double t) { return t > 0 ? nlohmann::json(t) : nlohmann::json(nullptr); };
  return {{"id", r.id},
          {"group", r.group},
          {"group_ranks", r.group_ranks},
          {"seq", r.seq},
          {"p2p", r.p2p},
          {"op", r.op},
          {"shape", r.shape},
          {"dtype", r.dtype},
          {"state", to_string(r.state)},
          {"enqueued_at", r.enqueued_at},
          {"started_at", time_or_null(r.started_at)},
          {"ended_at", time_or_null(r.ended_at)},
          {"error", r.error}};
}

}  // namespace

const char* to_string(CollectiveState state) {
  switch (state) {
    case CollectiveState::kScheduled: return "scheduled";
    case CollectiveState::kStarted: return "started";
    case CollectiveState::kCompleted: return "completed";
    case CollectiveState::kFailed: return "failed";
  }
  return "?";
}

namespace {

// Room each slot keeps for a typical record, written once so that its pages are resident from
// the start.
constexpr size_t kTextRoom = 24;  // op, group and dtype names ("all_gather_into_tensor")
constexpr size_t kShapeRoom = 4;  // dimensions

void touch(std::string& text) {
  text.assign(kTextRoom, ' ');
  text.clear();
}

// `slot` becomes `record`, in the slot's own buffers where they are large enough.
void assign_into(CollectiveRecord& slot, const CollectiveRecord& record) {
  slot.id = record.id;
  slot.group.assign(record.group);
  slot.group_ranks.assign(record.group_ranks.begin(), record.group_ranks.end());
  slot.seq = record.seq;
  slot.p2p = record.p2p;
  slot.op.assign(record.op);
  slot.shape.assign(record.shape.begin(), record.shape.end());
  slot.dtype.assign(record.dtype);
  slot.enqueued_at = record.enqueued_at;
  slot.started_at = record.started_at;
  slot.ended_at = record.ended_at;
  slot.wait_started_at = record.wait_started_at;
  slot.state = record.state;
  slot.error.clear();
}

}  // namespace

FlightRecorder::FlightRecorder(int rank, int world_size, size_t capacity)
    : rank_(rank), world_size_(world_size), capacity_(std::max<size_t>(capacity, 1)) {
  // Every slot with its buffers now, written once: the ring's memory is resident from the start
  // and records are copied into it. Filled record by record, the ring grew the process by 7-28
  // KB a step on multi-rank runs until trace_buf_size collectives had passed (issue 54).
  ring_.resize(capacity_);
  for (auto& slot : ring_) {
    touch(slot.group);
    touch(slot.op);
    touch(slot.dtype);
    slot.group_ranks.assign(static_cast<size_t>(std::max(world_size, 1)), 0);
    slot.group_ranks.clear();
    slot.shape.assign(kShapeRoom, 0);
    slot.shape.clear();
  }
}

uint64_t FlightRecorder::record(CollectiveRecord record) {
  std::lock_guard<std::mutex> lock(mutex_);
  record.id = next_id_++;
  record.enqueued_at = now_unix();
  record.state = CollectiveState::kScheduled;
  assign_into(ring_[record.id % capacity_], record);
  return record.id;
}

size_t FlightRecorder::filled() const {
  return static_cast<size_t>(std::min<uint64_t>(next_id_, capacity_));
}

CollectiveRecord* FlightRecorder::find(uint64_t id) {
  if (id >= next_id_) return nullptr;
  auto& slot = ring_[id % capacity_];
  return slot.id == id ? &slot : nullptr;
}

void FlightRecorder::started(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto* r = find(id); r && r->state == CollectiveState::kScheduled) {
    r->started_at = now_unix();
    r->state = CollectiveState::kStarted;
  }
}

void FlightRecorder::completed(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto* r = find(id); r && r->state != CollectiveState::kFailed) {
    if (r->started_at == 0) r->started_at = now_unix();
    r->ended_at = now_unix();
    r->state = CollectiveState::kCompleted;
  }
}

void FlightRecorder::failed(uint64_t id, const std::string& error, bool notify) {
  std::function<void(const std::string&)> callback;
  std::string what = error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto* r = find(id)) {
      r->ended_at = now_unix();
      r->state = CollectiveState::kFailed;
      r->error = error;
      what = r->op + " #" + std::to_string(r->seq) + " on group '" + r->group +
             "' failed on rank " + std::to_string(rank_);
    }
    if (notify) callback = on_failure_;
  }
  if (callback) callback(what);
}

void FlightRecorder::waiting(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto* r = find(id); r && r->ended_at == 0 && r->wait_started_at == 0) {
    r->wait_started_at = now_unix();
  }
}

std::optional<CollectiveRecord> FlightRecorder::longest_wait() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const CollectiveRecord* oldest = nullptr;
  for (size_t i = 0; i < filled(); ++i) {
    const CollectiveRecord& r = ring_[i];
    if (r.wait_started_at == 0 || r.ended_at != 0) continue;
    if (!oldest || r.wait_started_at < oldest->wait_started_at) oldest = &r;
  }
  if (!oldest) return std::nullopt;
  return *oldest;
}

std::vector<CollectiveRecord> FlightRecorder::records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CollectiveRecord> out;
  const size_t count = filled();
  out.reserve(count);
  // Once full, the oldest entry sits right after the newest.
  const size_t start = count < capacity_ ? 0 : next_id_ % capacity_;
  for (size_t i = 0; i < count; ++i) out.push_back(ring_[(start + i) % capacity_]);
  return out;
}

std::string FlightRecorder::to_json(const std::string& reason) const {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& r : records()) entries.push_back(distributed::to_json(r));
  nlohmann::json j = {{"format", "loom-flight-recorder/1"},
                      {"rank", rank_},
                      {"world_size", world_size_},
                      {"host", std::string(host)},
                      {"pid", static_cast<int64_t>(::getpid())},
                      {"reason", reason},
                      {"dumped_at", now_unix()},
                      {"capacity", capacity_},
                      {"entries", entries}};
  return j.dump(1);
}

void FlightRecorder::set_dump_path(const std::string& path) {
  std::lock_guard<std::mutex> lock(mutex_);
  dump_path_ = path;
}

bool FlightRecorder::dump(const std::string& reason, bool automatic) {
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (dump_path_.empty() || (automatic && dumped_automatically_)) return false;
    if (automatic) dumped_automatically_ = true;
    path = dump_path_;
  }
  try {
    const auto folder = std::filesystem::path(path).parent_path();
    if (!folder.empty()) files::create_directories(folder.string());
    files::write_atomic(path, to_json(reason) + "\n");
    log::get("comm")->warn(
        "flight recorder: {} collectives dumped to {} ({}); read with `loom "
        "debug hang {}`",
        records().size(), path, reason, folder.parent_path().string());
    return true;
  } catch (const std::exception& e) {
    log::get("comm")->error("flight recorder: cannot dump to {}: {}", path, e.what());
    return false;
  }
}

void FlightRecorder::set_failure_callback(std::function<void(const std::string&)> callback) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_failure_ = std::move(callback);
}

void install_dump_signal_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_handler = on_dump_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, nullptr);
  });
}

uint64_t dump_signals_received() {
  return g_dump_signals.load();
}

DumpWatcher::DumpWatcher(std::shared_ptr<FlightRecorder> recorder, Poll poll_requests,
                         std::function<void()> acknowledge, std::chrono::milliseconds interval)
    : recorder_(std::move(recorder)),
      poll_(std::move(poll_requests)),
      acknowledge_(std::move(acknowledge)),
      interval_(interval) {
  install_dump_signal_handler();
  thread_ = std::thread([this] { run(); });
}

DumpWatcher::~DumpWatcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void DumpWatcher::run() {
  uint64_t signals_seen = dump_signals_received();
  uint64_t requests_seen = 0;
  bool store_alive = static_cast<bool>(poll_);
  if (store_alive) {
    if (auto first = poll_()) requests_seen = first->count;
  }
  // The store is asked every fifth tick: every rank polls it, so keep the load on its host low.
  int tick = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, interval_, [this] { return stop_; })) {
    lock.unlock();
    const bool poll_store = store_alive && ++tick % 5 == 0;
    const uint64_t signals = dump_signals_received();
    if (signals != signals_seen) {
      signals_seen = signals;
      recorder_->dump("SIGUSR1", false);
    }
    if (poll_store) {
      // The store goes away when its host (rank 0) exits: stop asking.
      auto request = poll_();
      if (!request) {
        store_alive = false;
      } else if (request->count != requests_seen) {
        requests_seen = request->count;
        if (recorder_->dump(request->reason, true) && acknowledge_) acknowledge_();
      }
    }
    lock.lock();
  }
}

}  // namespace loom::distributed
