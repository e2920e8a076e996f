// The lighthouse's store layout and bounds, shared by its server (lighthouse.cpp) and its
// client (lighthouse_client.cpp). Private to src/distributed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::distributed::lighthouse_keys {

inline std::vector<uint8_t> bytes_of(const std::string& text) {
  return {text.begin(), text.end()};
}
inline std::string text_of(const std::vector<uint8_t>& bytes) {
  return {bytes.begin(), bytes.end()};
}

inline constexpr const char* kIdentity = "loom/lighthouse";
// A counter; ft/registered/<n> = the n-th registration's replica id.
inline constexpr const char* kRegistered = "ft/registered";
inline constexpr const char* kStatus = "ft/status";

inline std::string heartbeat_key(int64_t replica) {
  return "ft/heartbeat/" + std::to_string(replica);
}
// Incarnations of a replica id: a counter, the names, and a beat counter per name.
inline std::string incarnations_key(int64_t replica) {
  return "ft/incarnations/" + std::to_string(replica);
}
inline std::string incarnation_beat_key(int64_t replica, const std::string& incarnation) {
  return "ft/heartbeat/" + std::to_string(replica) + "/" + incarnation;
}
inline std::string refused_key(int64_t replica, const std::string& incarnation) {
  return "ft/refused/" + std::to_string(replica) + "/" + incarnation;
}
inline constexpr int kMaxIncarnationsPerReplica = 64;

inline std::string request_key(int64_t replica) {
  return "ft/request/" + std::to_string(replica);
}
inline std::string answer_key(int64_t replica, int64_t seq) {
  return "ft/answer/" + std::to_string(replica) + "/" + std::to_string(seq);
}

// Bounds on what the lighthouse reads from its store (anyone holding the secret writes there).
inline constexpr int64_t kMaxReplicaId = int64_t{1} << 20;
inline constexpr int kMaxRegistrationsPerTick = 256;
inline constexpr std::chrono::milliseconds kRegistrationGrace{5000};
inline constexpr size_t kMaxRequestBytes = 4096;
inline constexpr size_t kMaxIncarnationBytes = 128;
inline constexpr int64_t kMaxStep = int64_t{1} << 50;
inline constexpr size_t kMaxAnswerBytes = 1 << 22;

}  // namespace loom::distributed::lighthouse_keys
