// gradwire errors: one hierarchy rooted at gw::Error, each with a code.
//
// Messages name the operation and the offending values, so a user can act on them without a
// debugger:
//
//   try { gw::matmul(a, b); }
//   catch (const gw::ShapeError& e) { /* "[matmul] shapes (2,3) and (4,5) cannot be multiplied" */ }
//
// Library code throws these and never prints or exits. GW_CHECK builds its message only when
// the condition fails, so checks on hot paths cost one branch.
#pragma once

#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace gw {

enum class ErrorCode {
  kInvalidArgument,  // a value outside what the operation accepts
  kShape,            // shapes that do not fit together
  kDType,            // a dtype the operation does not support
  kIndex,            // an index or dim out of range
  kTimeout,          // a blocking call ran past its timeout
  kIo,               // files, sockets, malformed bytes
  kRemote,           // a failure raised on another worker
  kCuda,             // a CUDA runtime/driver/library call failed
  kState,            // an object used in a state that does not allow it
  kInternal,         // a bug in gradwire
};

const char* error_code_name(ErrorCode code);

// Every error derives from Error virtually, so that a remote failure (below) can be both its own
// type and a RemoteError and still be caught as one Error.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

#define GW_DEFINE_ERROR(Name, Code)                                      \
  class Name : public virtual Error {                                    \
   public:                                                               \
    static constexpr ErrorCode kCode = ErrorCode::Code;                  \
    explicit Name(const std::string& message) : Error(kCode, message) {} \
  }

GW_DEFINE_ERROR(InvalidArgumentError, kInvalidArgument);
GW_DEFINE_ERROR(ShapeError, kShape);
GW_DEFINE_ERROR(DTypeError, kDType);
GW_DEFINE_ERROR(IndexError, kIndex);
GW_DEFINE_ERROR(TimeoutError, kTimeout);
GW_DEFINE_ERROR(IoError, kIo);
GW_DEFINE_ERROR(CudaError, kCuda);
GW_DEFINE_ERROR(StateError, kState);
GW_DEFINE_ERROR(InternalError, kInternal);
#undef GW_DEFINE_ERROR

// A failure on another worker, re-raised on the caller with the worker's name. A failure that
// was one of the errors above there is raised here as RemoteFailure<ThatError>: catchable as
// that type (a remote timeout is a TimeoutError) and as RemoteError, whose worker() names the
// worker that answered with it (for a nested call, the one this worker called; the message
// keeps every hop's name). Anything else (a std::exception that is not a gw::Error) is a plain
// RemoteError.
class RemoteError : public virtual Error {
 public:
  static constexpr ErrorCode kCode = ErrorCode::kRemote;
  RemoteError(std::string worker, const std::string& message)
      : Error(kCode, "[" + worker + "] " + message), worker_(std::move(worker)) {}
  const std::string& worker() const noexcept { return worker_; }

 private:
  std::string worker_;
};

template <typename E>
class RemoteFailure final : public E, public RemoteError {
 public:
  // The virtual base Error is built here, once, with E's code; E's and RemoteError's own
  // initialisations of it are skipped.
  RemoteFailure(std::string worker, const std::string& message)
      : Error(E::kCode, "[" + worker + "] " + message),
        E(message),
        RemoteError(std::move(worker), message) {}
};

// The exception a failure with `code` raised on `worker` becomes on the caller.
std::exception_ptr remote_failure(ErrorCode code, const std::string& worker,
                                  const std::string& message);

// The message of a stored failure ("unknown error" for one that is no std::exception).
std::string what_of(const std::exception_ptr& failure);

namespace detail {
// Concatenates anything streamable: str("[add] dim ", d, " out of range").
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace gw

// Throws ErrType(message) when cond is false; the message arguments are evaluated only then.
#define GW_CHECK(cond, ErrType, ...) \
  do {                               \
    if (!(cond)) [[unlikely]]        \
      throw ErrType(::gw::detail::str(__VA_ARGS__)); \
  } while (0)
