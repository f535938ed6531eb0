#include "core/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string_view>

#include "core/error.h"

#if defined(__SSE4_2__) && defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace gw {

namespace {

constexpr const char* kFormat = "gradwire-checkpoint-1";
constexpr const char* kModel = "model/";
constexpr const char* kOptimizer = "optimizer/";
// The tensors' bytes' CRC-32C, as 8 hex digits: written by every save, checked by every load
// (checkpoints from before it have none, and load unchecked).
constexpr const char* kChecksum = "data_crc32c";
constexpr const char* kReserved[] = {"format", "epoch", "step", "seed", kChecksum};

// CRC-32C (Castagnoli) of `size` bytes, continuing from `crc` (0 to start): the CPU's crc32
// instruction, 8 bytes at a time (about 9 GB/s), where the build has SSE 4.2; else a table, a
// byte at a time.
uint32_t crc32c(uint32_t crc, const uint8_t* p, size_t size) {
  crc = ~crc;
#if defined(__SSE4_2__) && defined(__x86_64__)
  uint64_t c = crc;
  for (; size >= 8; p += 8, size -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  crc = static_cast<uint32_t>(c);
  for (; size > 0; ++p, --size) crc = _mm_crc32_u8(crc, *p);
#else
  static constexpr std::array<uint32_t, 256> kTable = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[i] = c;
    }
    return t;
  }();
  for (; size > 0; ++p, --size) crc = kTable[(crc ^ *p) & 0xffu] ^ (crc >> 8);
#endif
  return ~crc;
}

std::string hex8(uint32_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(8, '0');
  for (int i = 7; i >= 0; --i, v >>= 4) out[static_cast<size_t>(i)] = kDigits[v & 15];
  return out;
}

[[noreturn]] void fail(const char* op, const std::string& path, const char* what) {
  throw IoError(detail::str("[", op, "] ", what, " '", path, "' failed: ", std::strerror(errno)));
}

std::string tensors_path(const std::string& dir) { return dir + "/checkpoint.safetensors"; }

}  // namespace

void write_file_atomically(const std::string& path, const void* data, size_t size,
                           const char* op) {
  std::string tmp = path + ".tmp-XXXXXX";  // unique: two writers never share one; mode 0600
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) fail(op, path + ".tmp-XXXXXX", "creating");
  auto give_up = [&](const char* what) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    errno = e;
    fail(op, tmp, what);
  };
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t left = size; left > 0;) {  // bounded: each write takes at least one byte
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = EIO;
    if (n <= 0) give_up("writing");
    p += n, left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) give_up("flushing");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail(op, tmp, "closing");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    errno = e;
    fail(op, path, "renaming into");
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  if (const int d = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      d >= 0) {
    ::fsync(d);
    ::close(d);
  }
}

void save_checkpoint(const std::string& dir, const Checkpoint& c) {
  GW_CHECK(c.epoch >= 0 && c.step >= 0, InvalidArgumentError,
           "[save_checkpoint] epoch and step must be >= 0, got ", c.epoch, " and ", c.step);
  for (const char* key : kReserved) {
    GW_CHECK(!c.extra.contains(key), InvalidArgumentError, "[save_checkpoint] extra key \"", key,
             "\" is one the checkpoint writes itself; name it otherwise");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  GW_CHECK(!ec, IoError, "[save_checkpoint] cannot create directory '", dir, "': ", ec.message());
  NamedTensors all;
  for (const auto& [k, t] : c.model) all.emplace(kModel + k, t);
  for (const auto& [k, t] : c.optimizer) all.emplace(kOptimizer + k, t);
  std::map<std::string, std::string> meta = c.extra;
  meta["format"] = kFormat;
  meta["epoch"] = std::to_string(c.epoch);
  meta["step"] = std::to_string(c.step);
  meta["seed"] = std::to_string(c.seed);
  // The checksum lives in the header, before the data it covers: the file is made with 8 zeros in
  // its place, which are then overwritten with the data section's CRC (the header's length, and
  // so where the data starts, stay as they were). The data section is the tensors' bytes in name
  // order, which load_checkpoint sums again from the tensors it read.
  const std::string placeholder(8, '0');
  meta[kChecksum] = placeholder;
  std::vector<uint8_t> bytes = to_safetensors(all, meta);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = header_size << 8 | bytes[static_cast<size_t>(i)];
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, header_size);
  const std::string field = detail::str("\"", kChecksum, "\":\"", placeholder, "\"");
  // The first key of that name (__metadata__ comes before the tensors): a quote after '{' or ','
  // opens a key, as inside a JSON string every quote is escaped, so a program's extra key that
  // merely ends in the field (say "\"data_crc32c") is passed over.
  size_t at = text.find(field);
  while (at != std::string_view::npos && text[at - 1] != '{' && text[at - 1] != ',')
    at = text.find(field, at + 1);
  GW_CHECK(at != std::string_view::npos, InternalError,
           "[save_checkpoint] the checksum's place is missing from the header");
  meta[kChecksum] = hex8(crc32c(0, bytes.data() + 8 + header_size, bytes.size() - 8 - header_size));
  std::memcpy(bytes.data() + 8 + at + field.size() - 9, meta[kChecksum].data(), 8);
  write_file_atomically(tensors_path(dir), bytes.data(), bytes.size(), "save_checkpoint");
  // For people and scripts: the same metadata as JSON. A safetensors file is an 8-byte length
  // and then JSON: a file of no tensors gives exactly {"__metadata__": {...}}.
  const std::vector<uint8_t> header = to_safetensors({}, meta);
  std::string json(header.begin() + 8, header.end());
  while (!json.empty() && json.back() == ' ') json.pop_back();  // the alignment padding
  json += '\n';
  write_file_atomically(dir + "/checkpoint.json", json.data(), json.size(), "save_checkpoint");
}

std::optional<Checkpoint> load_checkpoint(const std::string& dir) {
  const std::string path = tensors_path(dir);
  if (!std::filesystem::exists(path)) return std::nullopt;
  std::map<std::string, std::string> meta;
  NamedTensors all = load_safetensors(path, &meta);
  GW_CHECK(meta["format"] == kFormat, IoError, "[load_checkpoint] '", path,
           "' is not a gradwire checkpoint (format '", meta["format"], "')");
  Checkpoint c;
  auto number = [&](const char* key, uint64_t max) {
    const std::string& v = meta[key];
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
    GW_CHECK(!v.empty() && std::isdigit(static_cast<unsigned char>(v[0])) && *end == '\0' &&
                 errno == 0 && n <= max,
             IoError, "[load_checkpoint] '", path, "': bad ", key, " '", v, "'");
    return static_cast<uint64_t>(n);
  };
  if (meta.contains(kChecksum)) {
    uint32_t crc = 0;
    for (const auto& [k, t] : all)  // name order: the data section's, as save_checkpoint laid it
      crc = crc32c(crc, static_cast<const uint8_t*>(t.raw_data()), t.nbytes());
    GW_CHECK(hex8(crc) == meta[kChecksum], IoError, "[load_checkpoint] '", path,
             "' is corrupt: its tensors' CRC-32C is ", hex8(crc), ", the checkpoint recorded ",
             meta[kChecksum], "; nothing was loaded");
  }
  constexpr auto kMaxInt64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  c.epoch = static_cast<int64_t>(number("epoch", kMaxInt64));
  c.step = static_cast<int64_t>(number("step", kMaxInt64));
  c.seed = number("seed", std::numeric_limits<uint64_t>::max());
  for (auto& [k, t] : all) {
    if (k.starts_with(kModel))
      c.model.emplace(k.substr(std::strlen(kModel)), std::move(t));
    else if (k.starts_with(kOptimizer))
      c.optimizer.emplace(k.substr(std::strlen(kOptimizer)), std::move(t));
    else
      throw IoError(detail::str("[load_checkpoint] '", path, "': unexpected tensor '", k, "'"));
  }
  for (const char* k : kReserved) meta.erase(k);
  c.extra = std::move(meta);
  return c;
}

}  // namespace gw
