// Status and Result<T>: errors as values on every internal path.
//
// A Status carries a chorusResult_t code and a message that says where, which
// rank/peer, the values that disagreed and a likely fix.  Success carries no
// allocation.  Result<T> is a T or a non-ok Status.
#pragma once

#include <chorus/chorus.h>

#include <fmt/format.h>

#include <cassert>
#include <memory>
#include <string>
#include <utility>
#include <variant>

namespace chorus {

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(chorusResult_t code, std::string message)
      : rep_(code == chorusSuccess ? nullptr : std::make_shared<Rep>(Rep{code, std::move(message)})) {}

  static Status ok() { return {}; }

  [[nodiscard]] bool isOk() const { return rep_ == nullptr; }
  explicit operator bool() const { return isOk(); }
  [[nodiscard]] chorusResult_t code() const { return rep_ ? rep_->code : chorusSuccess; }
  [[nodiscard]] const std::string& message() const {
    static const std::string kEmpty;
    return rep_ ? rep_->message : kEmpty;
  }
  // Prefixes the message with context ("allreduce #12: ") keeping the code.
  [[nodiscard]] Status withContext(std::string_view prefix) const {
    if (isOk()) return *this;
    return Status(code(), fmt::format("{}{}", prefix, message()));
  }

 private:
  struct Rep {
    chorusResult_t code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;  // shared: Status is cheap to copy
};

template <typename... Args>
Status makeError(chorusResult_t code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status invalidArgument(fmt::format_string<Args...> f, Args&&... args) {
  return makeError(chorusInvalidArgument, f, std::forward<Args>(args)...);
}
template <typename... Args>
Status invalidUsage(fmt::format_string<Args...> f, Args&&... args) {
  return makeError(chorusInvalidUsage, f, std::forward<Args>(args)...);
}
template <typename... Args>
Status systemError(fmt::format_string<Args...> f, Args&&... args) {
  return makeError(chorusSystemError, f, std::forward<Args>(args)...);
}
template <typename... Args>
Status remoteError(fmt::format_string<Args...> f, Args&&... args) {
  return makeError(chorusRemoteError, f, std::forward<Args>(args)...);
}
template <typename... Args>
Status internalError(fmt::format_string<Args...> f, Args&&... args) {
  return makeError(chorusInternalError, f, std::forward<Args>(args)...);
}

// A system error with strerror(errno) appended.
Status errnoError(std::string_view what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).isOk()); }  // NOLINT

  [[nodiscard]] bool isOk() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return isOk(); }
  [[nodiscard]] const Status& status() const {
    static const Status kOk;
    return isOk() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace chorus

// Propagates a non-ok Status (or the Status of a failed Result) to the caller.
#define CHORUS_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::chorus::Status chorus_status_ = (expr);         \
    if (!chorus_status_.isOk()) return chorus_status_; \
  } while (0)

#define CHORUS_CONCAT_INNER_(a, b) a##b
#define CHORUS_CONCAT_(a, b) CHORUS_CONCAT_INNER_(a, b)
// Assigns the value of a Result to lhs, or returns its Status.
#define CHORUS_ASSIGN_OR_RETURN(lhs, expr)                                   \
  auto CHORUS_CONCAT_(chorus_result_, __LINE__) = (expr);                    \
  if (!CHORUS_CONCAT_(chorus_result_, __LINE__).isOk())                      \
    return CHORUS_CONCAT_(chorus_result_, __LINE__).status();                \
  lhs = std::move(CHORUS_CONCAT_(chorus_result_, __LINE__)).value()
