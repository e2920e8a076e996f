// The job secret of a fault-tolerant job's control plane: the lighthouse and the store its replica
// process groups rendezvous on admit only connections that prove they hold it (auth_gate.h).
//
// A secret is 32 random bytes, written as 64 hex digits. Workers get it with the lighthouse's
// address in TORCHFT_LIGHTHOUSE, as `HOST:PORT?secret=HEX` or `HOST:PORT?secret_file=PATH`
// (`loom lighthouse` prints the exact value). It never travels on the wire: a connection proves
// it with HMAC-SHA256 over two fresh nonces, one from each side, and the server proves it back.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::distributed {

struct JobSecret {
  std::string bytes;  // raw key; empty: no secret (an open lighthouse)
  bool empty() const { return bytes.empty(); }
};

using Digest = std::array<uint8_t, 32>;

// 32 bytes from OpenSSL's CSPRNG; IoError when it has no entropy.
JobSecret make_job_secret();
// 64 hex digits -> secret; InputError naming `source` otherwise (the secret is never echoed).
JobSecret parse_job_secret(std::string_view hex, const std::string& source);
// The first line of `path` as parse_job_secret; InputError naming the file.
JobSecret read_job_secret_file(const std::string& path);
std::string to_hex(const JobSecret& secret);

Digest hmac_sha256(const JobSecret& key, std::string_view message);
// Constant time (a timing difference must not tell an attacker how many bytes matched).
bool same_digest(const Digest& a, const Digest& b);

// One entry of TORCHFT_LIGHTHOUSE split into the address ("HOST:PORT", "http://HOST:PORT") and
// its secret (`?secret=HEX` or `?secret_file=PATH`; none: empty). InputError naming `source` for
// another query or an unreadable secret.
struct LighthouseTarget {
  std::string address;
  JobSecret secret;
};
LighthouseTarget split_lighthouse_target(const std::string& text, const std::string& source);

// The secret of this worker's rendezvous store (secured_store.h): LOOM_JOB_SECRET (64 hex
// digits) or the file LOOM_JOB_SECRET_FILE names, else, for a fault-tolerant job, the secret
// TORCHFT_LIGHTHOUSE's first entry carries (every rank of a group has the same); empty when
// none is set. InputError naming the variable when it is malformed.
JobSecret job_secret_from_env(bool fault_tolerant);

// `text` with every `secret=...` value replaced by `***` (for logs and errors).
std::string redact_secret(const std::string& text);

}  // namespace loom::distributed
