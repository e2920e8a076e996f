// Hang forensics: every rank keeps a ring buffer of its last collectives (comm.trace_buf_size
// entries), and dumps it as JSON into <dump_folder>/<comm.save_traces_folder>/<prefix><rank>.json
// when a collective fails or times out, when another rank asks (through the job's TCPStore), or
// on SIGUSR1 (`loom launch` forwards it to its workers). `loom debug hang` merges the dumps and
// names the rank and collective where the job diverged (distributed/hang_report.h).
//
// Times: enqueued_at when loom issued the collective, started_at when the backend accepted it
// (Gloo and NCCL run it on their own thread or stream from then on), ended_at when loom saw it
// complete (wait()). Unix seconds.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace loom::distributed {

enum class CollectiveState { kScheduled, kStarted, kCompleted, kFailed };
const char* to_string(CollectiveState state);

struct CollectiveRecord {
  uint64_t id = 0;               // order on this rank, over every group
  std::string group;             // "world", "dp_shard", ...
  std::vector<int> group_ranks;  // global ranks of the group
  int64_t seq = 0;  // the group's n-th collective (1-based); point-to-point ops count apart
  bool p2p = false;
  std::string op;  // "all_reduce", "broadcast", ...
  std::vector<int64_t> shape;
  std::string dtype;
  double enqueued_at = 0;
  double started_at = 0;  // 0: not yet
  double ended_at = 0;    // 0: not yet
  double wait_started_at = 0;  // when this rank first blocked on it (Work::wait); 0: not yet
  CollectiveState state = CollectiveState::kScheduled;
  std::string error;
};

class FlightRecorder {
 public:
  FlightRecorder(int rank, int world_size, size_t capacity);

  int rank() const { return rank_; }
  size_t capacity() const { return capacity_; }

  // A collective issued now; returns its id for the calls below.
  uint64_t record(CollectiveRecord record);
  void started(uint64_t id);
  void completed(uint64_t id);
  // This rank now blocks on it (the collective watchdog measures hangs from here: an async
  // collective nobody waits for is not a hang).
  void waiting(uint64_t id);
  // Marks it failed; a communication failure (`notify`) runs the failure callback (dump, and ask
  // the other ranks to dump). Bad arguments refused before anything was sent do not.
  void failed(uint64_t id, const std::string& error, bool notify = true);

  // Oldest first; at most capacity() entries.
  std::vector<CollectiveRecord> records() const;
  // The collective this rank has been blocked on longest (waiting, not yet ended), if any.
  std::optional<CollectiveRecord> longest_wait() const;
  // The dump file's content.
  std::string to_json(const std::string& reason) const;

  // Where dump() writes; empty: nowhere. The folder is created on the first dump.
  void set_dump_path(const std::string& path);
  const std::string& dump_path() const { return dump_path_; }
  // Writes the dump (atomically). `automatic`: a failure or a peer's request; only the first
  // automatic dump of a recorder is written, so the state when the hang was first noticed is
  // not overwritten by the errors that follow. SIGUSR1 dumps always write. Never throws (a dump
  // must not hide the error that caused it); returns whether a file was written.
  bool dump(const std::string& reason, bool automatic);

  // Called (outside the recorder's lock) when a collective failed, with a description.
  void set_failure_callback(std::function<void(const std::string&)> callback);

 private:
  CollectiveRecord* find(uint64_t id);  // null once overwritten
  size_t filled() const;                 // slots holding a record (all, once it wrapped)

  const int rank_;
  const int world_size_;
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<CollectiveRecord> ring_;
  uint64_t next_id_ = 0;
  std::string dump_path_;
  bool dumped_automatically_ = false;
  std::function<void(const std::string&)> on_failure_;
};

// SIGUSR1 asks every rank to dump its flight recorder. The handler only counts; watchers poll.
void install_dump_signal_handler();
uint64_t dump_signals_received();

// One rank's watcher thread: dumps on SIGUSR1 (checked every `interval`), and on a request
// another rank posted to the job's store (asked every 5 intervals) (`poll_requests` returns the
// store's request counter and reason, or nothing once the store is gone); `acknowledge` then tells
// the store this rank has dumped.
class DumpWatcher {
 public:
  struct Request {
    uint64_t count = 0;
    std::string reason;
  };
  using Poll = std::function<std::optional<Request>()>;

  DumpWatcher(std::shared_ptr<FlightRecorder> recorder, Poll poll_requests,
              std::function<void()> acknowledge,
              std::chrono::milliseconds interval = std::chrono::milliseconds(200));
  ~DumpWatcher();
  DumpWatcher(const DumpWatcher&) = delete;
  DumpWatcher& operator=(const DumpWatcher&) = delete;

 private:
  void run();

  std::shared_ptr<FlightRecorder> recorder_;
  Poll poll_;
  std::function<void()> acknowledge_;
  std::chrono::milliseconds interval_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace loom::distributed
