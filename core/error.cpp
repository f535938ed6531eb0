#include "core/error.h"

namespace gw {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kShape: return "Shape";
    case ErrorCode::kDType: return "DType";
    case ErrorCode::kIndex: return "Index";
    case ErrorCode::kTimeout: return "Timeout";
    case ErrorCode::kIo: return "Io";
    case ErrorCode::kRemote: return "Remote";
    case ErrorCode::kCuda: return "Cuda";
    case ErrorCode::kState: return "State";
    case ErrorCode::kInternal: return "Internal";
  }
  return "Unknown";
}

namespace {
template <typename E>
std::exception_ptr remote(const std::string& worker, const std::string& message) {
  return std::make_exception_ptr(RemoteFailure<E>(worker, message));
}
}  // namespace

std::exception_ptr remote_failure(ErrorCode code, const std::string& worker,
                                  const std::string& message) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return remote<InvalidArgumentError>(worker, message);
    case ErrorCode::kShape:
      return remote<ShapeError>(worker, message);
    case ErrorCode::kDType:
      return remote<DTypeError>(worker, message);
    case ErrorCode::kIndex:
      return remote<IndexError>(worker, message);
    case ErrorCode::kTimeout:
      return remote<TimeoutError>(worker, message);
    case ErrorCode::kIo:
      return remote<IoError>(worker, message);
    case ErrorCode::kCuda:
      return remote<CudaError>(worker, message);
    case ErrorCode::kState:
      return remote<StateError>(worker, message);
    case ErrorCode::kInternal:
      return remote<InternalError>(worker, message);
    case ErrorCode::kRemote:
      break;
  }
  return std::make_exception_ptr(RemoteError(worker, message));
}

std::string what_of(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace gw
