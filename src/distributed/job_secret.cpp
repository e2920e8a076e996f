#include "loom/distributed/job_secret.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "loom/core/check.h"
#include "loom/core/env.h"
#include "loom/core/files.h"
#include "loom/core/strings.h"

namespace loom::distributed {
namespace {

constexpr size_t kSecretBytes = 32;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

JobSecret make_job_secret() {
  JobSecret s;
  s.bytes.resize(kSecretBytes);
  LOOM_CHECK_AS(IoError,
                RAND_bytes(reinterpret_cast<unsigned char*>(s.bytes.data()), kSecretBytes) == 1,
                "cannot draw a job secret: OpenSSL's random generator has no entropy");
  return s;
}

JobSecret parse_job_secret(std::string_view hex, const std::string& source) {
  while (!hex.empty() && (hex.back() == '\n' || hex.back() == '\r' || hex.back() == ' ')) {
    hex.remove_suffix(1);
  }
  JobSecret s;
  bool ok = hex.size() == 2 * kSecretBytes;
  for (size_t i = 0; ok && i < hex.size(); i += 2) {
    const int hi = hex_value(hex[i]), lo = hex_value(hex[i + 1]);
    ok = hi >= 0 && lo >= 0;
    s.bytes.push_back(static_cast<char>(hi * 16 + lo));
  }
  LOOM_CHECK_AS(InputError, ok, source, ": a job secret is ", 2 * kSecretBytes,
                " hex digits (as `loom lighthouse` makes; got ", hex.size(), " characters)");
  return s;
}

JobSecret read_job_secret_file(const std::string& path) {
  const std::string text = files::read_file(path, "job secret file", 4096);
  return parse_job_secret(text.substr(0, text.find('\n')), "job secret file " + path);
}

std::string to_hex(const JobSecret& secret) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : secret.bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

Digest hmac_sha256(const JobSecret& key, std::string_view message) {
  Digest out{};
  unsigned int size = 0;
  const unsigned char* done = HMAC(
      EVP_sha256(), key.bytes.data(), static_cast<int>(key.bytes.size()),
      reinterpret_cast<const unsigned char*>(message.data()), message.size(), out.data(), &size);
  LOOM_CHECK(done != nullptr && size == out.size(), "HMAC-SHA256 failed in OpenSSL");
  return out;
}

bool same_digest(const Digest& a, const Digest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

LighthouseTarget split_lighthouse_target(const std::string& text, const std::string& source) {
  LighthouseTarget t;
  const auto query = text.find('?');
  t.address = text.substr(0, query);
  if (query == std::string::npos) return t;
  const std::string rest = text.substr(query + 1);
  const auto eq = rest.find('=');
  const std::string key = rest.substr(0, eq);
  const std::string value = eq == std::string::npos ? "" : rest.substr(eq + 1);
  if (key == "secret") {
    t.secret = parse_job_secret(value, source + " (secret=)");
  } else if (key == "secret_file") {
    t.secret = read_job_secret_file(value);
  } else {
    // Not echoed: an unknown key's value may be a secret under another name.
    LOOM_THROW(InputError, source, ": '", t.address,
               "?...' has an unknown query (expected HOST:PORT?secret=HEX or "
               "HOST:PORT?secret_file=PATH, as `loom lighthouse` prints)");
  }
  return t;
}

JobSecret job_secret_from_env(bool fault_tolerant) {
  if (const auto hex = env::get("LOOM_JOB_SECRET"))
    return parse_job_secret(*hex, "LOOM_JOB_SECRET");
  if (const auto path = env::get("LOOM_JOB_SECRET_FILE")) return read_job_secret_file(*path);
  if (!fault_tolerant) return {};
  const auto lighthouses = env::get("TORCHFT_LIGHTHOUSE");
  if (!lighthouses) return {};
  const auto entries = strings::split_list(*lighthouses);
  if (entries.empty()) return {};
  return split_lighthouse_target(entries.front(), "TORCHFT_LIGHTHOUSE").secret;
}

std::string redact_secret(const std::string& text) {
  std::string out = text;
  for (size_t at = out.find("secret="); at != std::string::npos; at = out.find("secret=", at + 1)) {
    const size_t begin = at + 7;
    size_t end = begin;
    while (end < out.size() && out[end] != ',' && out[end] != '&' && out[end] != ' ') ++end;
    out.replace(begin, end - begin, "***");
  }
  return out;
}

}  // namespace loom::distributed
