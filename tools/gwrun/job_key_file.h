// JobKeyFile: the job key gwrun hands its workers (README "Security", store/job_key.h).
//
// If GW_JOB_KEY_FILE is set, that file is the job's key: it is checked and passed on (on several
// nodes, every node's gwrun must name the same key). Otherwise, on a single node, gwrun makes a
// fresh random key in a private directory (mode 0700, the file 0600), sets GW_JOB_KEY_FILE to
// it for the workers it starts, and removes both when the job ends. Several nodes without a
// key file get none: their workers then refuse to listen beyond loopback.
//
//   JobKeyFile key(options.nnodes);  // before the workers start; removed when it goes
#pragma once

#include <string>

namespace gw::gwrun {

class JobKeyFile {
 public:
  explicit JobKeyFile(int nnodes);
  ~JobKeyFile();
  JobKeyFile(const JobKeyFile&) = delete;
  JobKeyFile& operator=(const JobKeyFile&) = delete;

 private:
  std::string made_dir_;  // the directory this gwrun made, if it made the key
};

}  // namespace gw::gwrun
