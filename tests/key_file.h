// A fresh job key in a private temporary directory, removed with it: for the tests (and
// benchmarks) that hand a key to processes the way a job does (GW_JOB_KEY_FILE).
//
//   gw::test::KeyFile key;                  // key.key, key.path
//   gw::test::KeyFile shared(/*export_env=*/true);  // also GW_JOB_KEY_FILE while it lives
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

#include "store/job_key.h"

namespace gw::test {

struct KeyFile {
  store::JobKey key = store::JobKey::generate();
  std::filesystem::path dir, path;
  bool exported = false;

  explicit KeyFile(bool export_env = false) : exported(export_env) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "gw-key-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp " + tmpl);
    dir = tmpl;
    path = dir / "job.key";
    key.write_new(path.string());
    if (exported) ::setenv(store::kJobKeyEnv, path.c_str(), 1);
  }
  ~KeyFile() {
    if (exported) ::unsetenv(store::kJobKeyEnv);
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  KeyFile(const KeyFile&) = delete;
  KeyFile& operator=(const KeyFile&) = delete;
};

}  // namespace gw::test
