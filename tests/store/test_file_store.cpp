// FileStore beyond the shared contract: file errors and corrupt files.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "store/file_store.h"
#include "tests/store/store_test_util.h"

using namespace gw::store;
using namespace gw::store::test;
using Catch::Matchers::Contains;

TEST_CASE("FileStore names the path when it cannot open the file", "[store][file]") {
  TempDir dir;
  const std::string path = dir.path() + "/missing_dir/store";
  CHECK_THROWS_AS(FileStore(path), gw::IoError);
  CHECK_THROWS_WITH(FileStore(path), Contains(path) && Contains("No such file or directory"));
  CHECK_THROWS_AS(FileStore(""), gw::InvalidArgumentError);
}

TEST_CASE("FileStore refuses a file that is not a store", "[store][file]") {
  TempDir dir;
  const std::string path = dir.path() + "/not_a_store";
  std::ofstream(path) << "some unrelated text";
  CHECK_THROWS_AS(FileStore(path), gw::IoError);
  CHECK_THROWS_WITH(FileStore(path), Contains(path) && Contains("not a FileStore file"));
}

TEST_CASE("FileStore detects a truncated file", "[store][file]") {
  TempDir dir;
  const std::string path = dir.path() + "/store";
  FileStore store(path);
  store.set("key", std::string(100, 'x'));
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 10);
  CHECK_THROWS_AS(store.get("key"), gw::IoError);
  CHECK_THROWS_WITH(store.check({"key"}), Contains("truncated") && Contains(path));
}
