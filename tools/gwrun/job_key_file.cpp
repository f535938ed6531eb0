#include "tools/gwrun/job_key_file.h"

#include <stdlib.h>

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "store/job_key.h"

namespace gw::gwrun {

JobKeyFile::JobKeyFile(int nnodes) {
  if (const char* given = std::getenv(store::kJobKeyEnv); given != nullptr && *given != '\0') {
    store::JobKey::load(given);  // a bad file is reported now, not by every worker
    return;
  }
  if (nnodes > 1) {
    std::fprintf(stderr,
                 "gwrun: %d nodes and no %s shared by them: the workers have no job key "
                 "(README \"Security\")\n",
                 nnodes, store::kJobKeyEnv);
    return;
  }
  std::string dir = (std::filesystem::temp_directory_path() / "gwrun-XXXXXX").string();
  GW_CHECK(::mkdtemp(dir.data()) != nullptr, IoError,
           "[gwrun] cannot make a private directory for the job key in ",
           std::filesystem::temp_directory_path().string());
  made_dir_ = dir;
  const std::string path = dir + "/job.key";
  store::JobKey::generate().write_new(path);
  GW_CHECK(::setenv(store::kJobKeyEnv, path.c_str(), 1) == 0, IoError, "[gwrun] cannot set ",
           store::kJobKeyEnv);
}

JobKeyFile::~JobKeyFile() {
  if (made_dir_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(made_dir_, ignored);
}

}  // namespace gw::gwrun
