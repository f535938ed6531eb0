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

}  // namespace gw
