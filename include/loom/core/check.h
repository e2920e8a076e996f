// Checks that throw typed exceptions carrying file:line. Library code never exits or aborts, so
// the trainer and the checkpoint writer can always unwind and flush.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace loom {

// Base of every loom exception: the message plus where it was raised.
class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line);
  // The message without the source location.
  const std::string& message() const { return message_; }
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_;
  const char* file_;
  int line_;
};

// Bad user input: config files, CLI arguments, data or tokenizer files, checkpoints.
class InputError : public Error {
  using Error::Error;
};
// A file or directory could not be read or written.
class IoError : public Error {
  using Error::Error;
};
// A broken invariant inside loom (a bug, not bad input).
class InternalError : public Error {
  using Error::Error;
};

namespace detail {

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <typename E>
[[noreturn]] void throw_error(const char* file, int line, std::string message) {
  throw E(message, file, line);
}

}  // namespace detail
}  // namespace loom

// LOOM_CHECK(cond, parts...) throws loom::InternalError (naming cond) when cond is false.
// LOOM_CHECK_AS(ExceptionType, cond, parts...) throws the given loom::Error subclass.
// LOOM_THROW(ExceptionType, parts...) throws unconditionally.
// The message parts are streamed together, so numbers and strings mix freely.
#define LOOM_THROW(ExceptionType, ...)                           \
  ::loom::detail::throw_error<ExceptionType>(__FILE__, __LINE__, \
                                             ::loom::detail::concat(__VA_ARGS__))

#define LOOM_CHECK_AS(ExceptionType, cond, ...)                                        \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      ::loom::detail::throw_error<ExceptionType>(__FILE__, __LINE__,                   \
                                                 ::loom::detail::concat(__VA_ARGS__)); \
    }                                                                                  \
  } while (false)

// Internal invariants also name the failed condition.
#define LOOM_CHECK(cond, ...) \
  LOOM_CHECK_AS(::loom::InternalError, cond, "check failed: " #cond ": ", __VA_ARGS__)
