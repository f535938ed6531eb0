#include "core/cuda/cuda_error.h"

#include <cstring>

namespace gw::cuda {

namespace {
// __FILE__ is an absolute or build-relative path; the repo-relative tail is what a reader needs.
const char* short_file(const char* file) {
  const char* p = std::strstr(file, "core/cuda/");
  return p ? p : file;
}
}  // namespace

std::string error_message(cudaError_t status, const char* call) {
  return detail::str("[cuda] ", call, " failed: ", cudaGetErrorName(status), " (",
                     static_cast<int>(status), "): ", cudaGetErrorString(status));
}

std::string error_message(cublasStatus_t status, const char* call) {
  return detail::str("[cuda] ", call, " failed: ", cublasGetStatusName(status), " (",
                     static_cast<int>(status), "): ", cublasGetStatusString(status));
}

void throw_error(cudaError_t status, const char* call, const char* file, int line) {
  clear_last_error();
  throw CudaError(detail::str(error_message(status, call), " at ", short_file(file), ":", line));
}

void throw_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw CudaError(detail::str(error_message(status, call), " at ", short_file(file), ":", line));
}

}  // namespace gw::cuda
