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

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

#define GW_DEFINE_ERROR(Name, Code)                                              \
  class Name : public Error {                                                    \
   public:                                                                       \
    explicit Name(const std::string& message) : Error(ErrorCode::Code, message) {} \
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

// A failure on another worker, re-raised on the caller with the worker's name.
class RemoteError : public Error {
 public:
  RemoteError(std::string worker, const std::string& message)
      : Error(ErrorCode::kRemote, "[" + worker + "] " + message), worker_(std::move(worker)) {}
  const std::string& worker() const noexcept { return worker_; }

 private:
  std::string worker_;
};

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
