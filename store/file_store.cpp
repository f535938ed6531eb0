#include "store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "store/byte_codec.h"

namespace gw::store {
namespace {

// Identifies the format, so pointing a FileStore at some other file fails loudly.
constexpr char kMagic[] = "GWSTORE1";
constexpr size_t kMagicSize = sizeof(kMagic) - 1;

// The store file opened and flock()ed for one operation. A fresh open per operation because
// flock belongs to the open file description: threads sharing one descriptor would not exclude
// each other.
class LockedFile {
 public:
  LockedFile(const std::string& path, const char* op, int lock_kind) : path_(path), op_(op) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    GW_CHECK(fd_ >= 0, IoError, "[", op, "] cannot open store file '", path,
             "': ", std::strerror(errno));
    int rc;
    do rc = ::flock(fd_, lock_kind);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      int err = errno;
      ::close(fd_);
      throw IoError(
          gw::detail::str("[", op, "] cannot lock store file '", path, "': ", std::strerror(err)));
    }
  }
  ~LockedFile() { ::close(fd_); }  // closing releases the lock
  LockedFile(const LockedFile&) = delete;
  LockedFile& operator=(const LockedFile&) = delete;

  KeyMap read() {
    struct stat st {};
    GW_CHECK(::fstat(fd_, &st) == 0, IoError, "[", op_, "] cannot stat '", path_,
             "': ", std::strerror(errno));
    Bytes data(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::pread(fd_, data.data() + done, data.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      GW_CHECK(n > 0, IoError, "[", op_, "] cannot read '", path_,
               "': ", n == 0 ? "unexpected end of file" : std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    KeyMap map;
    if (data.empty()) return map;  // a store nobody has written yet
    GW_CHECK(data.size() >= kMagicSize && std::equal(kMagic, kMagic + kMagicSize, data.begin()),
             IoError, "[", op_, "] '", path_, "' is not a FileStore file");
    data.erase(data.begin(), data.begin() + kMagicSize);
    detail::ByteReader r(std::move(data), gw::detail::str(op_, " reading '", path_, "'"));
    uint32_t count = r.u32();
    for (uint32_t i = 0; i < count; ++i) {
      std::string key = r.str();
      map[std::move(key)] = r.bytes();
    }
    r.expect_done();
    return map;
  }

  void write(const KeyMap& map) {
    detail::ByteWriter w(op_);
    for (size_t i = 0; i < kMagicSize; ++i) w.u8(static_cast<uint8_t>(kMagic[i]));
    w.u32(static_cast<uint32_t>(map.size()));
    for (const auto& [key, value] : map) {
      w.str(key);
      w.bytes(value);
    }
    const Bytes& data = w.buffer();
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      GW_CHECK(n > 0, IoError, "[", op_, "] cannot write '", path_, "': ", std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    GW_CHECK(::ftruncate(fd_, static_cast<off_t>(data.size())) == 0, IoError, "[", op_,
             "] cannot truncate '", path_, "': ", std::strerror(errno));
  }

 private:
  int fd_ = -1;
  const std::string& path_;
  const char* op_;
};

// Runs `fn(map)` under an exclusive lock and writes the map back if `fn` reports a change.
template <typename Fn>
auto update(const std::string& path, const char* op, Fn&& fn) {
  LockedFile file(path, op, LOCK_EX);
  KeyMap map = file.read();
  bool changed = false;
  auto result = fn(map, changed);
  if (changed) file.write(map);
  return result;
}

KeyMap read_map(const std::string& path, const char* op) {
  return LockedFile(path, op, LOCK_SH).read();
}

}  // namespace

FileStore::FileStore(std::string path, int world_size, Milliseconds timeout)
    : Store(timeout), path_(std::move(path)), world_size_(world_size) {
  GW_CHECK(!path_.empty(), InvalidArgumentError, "[FileStore] path is empty");
  read_map(path_, "FileStore");  // fail now, naming the path, rather than at the first use
}

void FileStore::set(const std::string& key, const Bytes& value) {
  update(path_, "FileStore::set", [&](KeyMap& map, bool& changed) {
    map[key] = value;
    changed = true;
    return 0;
  });
}

Bytes FileStore::get(const std::string& key) {
  return wait_for("FileStore::get", {key}, timeout()).at(key);
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  return update(path_, "FileStore::add", [&](KeyMap& map, bool& changed) {
    changed = true;
    return add_to_map("FileStore::add", map, key, delta);
  });
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return update(path_, "FileStore::compare_set", [&](KeyMap& map, bool& changed) {
    CompareSetResult result = compare_set_in_map(map, key, expected, desired);
    changed = result.swapped;
    return std::move(result.value);
  });
}

bool FileStore::check(const std::vector<std::string>& keys) {
  return map_has_all(read_map(path_, "FileStore::check"), keys);
}

bool FileStore::delete_key(const std::string& key) {
  return update(path_, "FileStore::delete_key", [&](KeyMap& map, bool& changed) {
    changed = map.erase(key) > 0;
    return changed;
  });
}

int64_t FileStore::num_keys() {
  return static_cast<int64_t>(read_map(path_, "FileStore::num_keys").size());
}

void FileStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  wait_for("FileStore::wait", keys, timeout);
}

KeyMap FileStore::wait_for(const char* op, const std::vector<std::string>& keys,
                           Milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  // Start fast so a key that is about to appear costs ~1 ms; back off so a long wait does not
  // hammer the file.
  Milliseconds backoff{1};
  for (;;) {
    KeyMap map = read_map(path_, op);
    if (map_has_all(map, keys)) return map;
    auto now = Clock::now();
    if (now >= deadline)
      throw TimeoutError(wait_timeout_message(
          op, keys, timeout, [&](const std::string& k) { return map.contains(k); }));
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, Milliseconds{20});
  }
}

}  // namespace gw::store
