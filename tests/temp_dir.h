// A fresh directory under the system's temporary directory, removed with everything in it when
// the object goes: for tests that write files (checkpoints, FIFOs, keys).
//
//   gw::test::TempDir dir("gw_ckpt");   // dir.path: "/tmp/gw_ckpt_Ab12Cd"
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace gw::test {

struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix = "gw_test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp " + tmpl);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace gw::test
