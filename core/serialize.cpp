// Two byte formats for tensors: gradwire's own compact one (serialize/deserialize) and Hugging
// Face safetensors. Readers treat their input as hostile: every length, offset and dtype is
// checked before it is used, and any problem is an IoError naming the field and its value.
#include "core/serialize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string_view>

#include "core/ops/creation.h"
#include "core/safetensors_file.h"

namespace gw {

// Both formats are little-endian on the wire and we copy elements with memcpy.
static_assert(std::endian::native == std::endian::little,
              "gradwire's serialization assumes a little-endian host");

namespace {

constexpr uint8_t kMagic[4] = {'G', 'W', 'T', '1'};
constexpr size_t kMaxDims = 64;
constexpr uint8_t kNumDTypes = static_cast<uint8_t>(DType::Float64) + 1;
// The reference implementation's cap; a larger header is a corrupt or hostile file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// The bytes to write: on the CPU, row-major, copied at most once.
Tensor host_contiguous(const Tensor& t) { return t.to(kCPU).contiguous(); }

// numel * itemsize, or nullopt when a size is negative or the product leaves int64.
std::optional<uint64_t> checked_nbytes(std::span<const int64_t> shape, DType dtype) {
  uint64_t n = itemsize(dtype);
  for (int64_t s : shape) {
    if (s < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(s), &n)) return std::nullopt;
  }
  if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return n;
}

// A fresh tensor that owns a copy of `data` (the caller checked the length).
Tensor tensor_from_bytes(const uint8_t* data, const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (t.nbytes() > 0) std::memcpy(t.raw_data(), data, t.nbytes());
  return t;
}

void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  uint8_t b[8];
  std::memcpy(b, &v, 8);
  out.insert(out.end(), b, b + 8);
}

uint64_t get_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

// --- gradwire's own format -------------------------------------------------------------------
// "GWT1", u8 dtype, u8 ndim, ndim x i64 sizes, raw elements.

std::vector<uint8_t> serialize(const Tensor& t) {
  GW_CHECK(t.defined(), InvalidArgumentError, "[serialize] the tensor is undefined");
  GW_CHECK(static_cast<size_t>(t.dim()) <= kMaxDims, InvalidArgumentError, "[serialize] ndim ",
           t.dim(), " exceeds the maximum of ", kMaxDims);
  Tensor c = host_contiguous(t);
  std::vector<uint8_t> out;
  out.reserve(6 + 8 * c.dim() + c.nbytes());
  out.insert(out.end(), kMagic, kMagic + 4);
  out.push_back(static_cast<uint8_t>(c.dtype()));
  out.push_back(static_cast<uint8_t>(c.dim()));
  for (int64_t s : c.sizes()) put_u64(out, static_cast<uint64_t>(s));
  const auto* data = static_cast<const uint8_t*>(c.raw_data());
  if (c.nbytes() > 0) out.insert(out.end(), data, data + c.nbytes());
  return out;
}

Tensor deserialize(std::span<const uint8_t> bytes) {
  GW_CHECK(bytes.size() >= 6, IoError, "[deserialize] truncated header: got ", bytes.size(),
           " bytes, need at least 6");
  if (!std::equal(kMagic, kMagic + 4, bytes.begin())) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%02x%02x%02x%02x", bytes[0], bytes[1], bytes[2], bytes[3]);
    throw IoError(detail::str("[deserialize] bad magic 0x", hex, " (expected \"GWT1\")"));
  }
  uint8_t code = bytes[4];
  size_t ndim = bytes[5];
  GW_CHECK(code < kNumDTypes, IoError, "[deserialize] unknown dtype value ", int(code),
           " (valid: 0..", kNumDTypes - 1, ")");
  auto dtype = static_cast<DType>(code);
  GW_CHECK(ndim <= kMaxDims, IoError, "[deserialize] ndim ", ndim, " exceeds the maximum of ",
           kMaxDims);
  size_t header = 6 + 8 * ndim;
  GW_CHECK(bytes.size() >= header, IoError, "[deserialize] truncated header: ndim ", ndim,
           " needs ", header, " bytes, got ", bytes.size());
  Shape shape(ndim);
  for (size_t i = 0; i < ndim; ++i) {
    shape[i] = static_cast<int64_t>(get_u64(bytes.data() + 6 + 8 * i));
    GW_CHECK(shape[i] >= 0, IoError, "[deserialize] negative size ", shape[i], " at dim ", i);
  }
  auto nbytes = checked_nbytes(shape, dtype);
  GW_CHECK(nbytes.has_value(), IoError, "[deserialize] shape ", shape_str(shape), " of ", dtype,
           " overflows the byte count");
  GW_CHECK(bytes.size() - header == *nbytes, IoError, "[deserialize] shape ", shape_str(shape),
           " of ", dtype, " needs ", *nbytes, " data bytes, got ", bytes.size() - header);
  return tensor_from_bytes(bytes.data() + header, shape, dtype);
}

// --- safetensors -----------------------------------------------------------------------------

namespace {

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::Bool:
      return "BOOL";
    case DType::Int32:
      return "I32";
    case DType::Int64:
      return "I64";
    case DType::Float16:
      return "F16";
    case DType::BFloat16:
      return "BF16";
    case DType::Float32:
      return "F32";
    case DType::Float64:
      return "F64";
  }
  return "?";
}

std::optional<DType> parse_safetensors_dtype(std::string_view s) {
  for (uint8_t i = 0; i < kNumDTypes; ++i) {
    auto t = static_cast<DType>(i);
    if (s == safetensors_dtype(t)) return t;
  }
  return std::nullopt;
}

// JSON text must be UTF-8; checking it up front keeps bad names out of error messages too.
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<uint8_t>(s[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xe  ? 3
                 : (c >> 3) == 0x1e ? 4
                                    : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : c & (0x7f >> len);
    for (size_t k = 1; k < len; ++k) {
      auto cc = static_cast<uint8_t>(s[i + k]);
      if ((cc >> 6) != 0x2) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) return false;
    i += len;
  }
  return true;
}

void append_json_string(std::string& out, std::string_view s, const char* op) {
  GW_CHECK(valid_utf8(s), InvalidArgumentError, "[", op, "] name or metadata is not UTF-8");
  out += '"';
  for (char ch : s) {
    auto c = static_cast<uint8_t>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += '"';
}

// A strict reader for exactly the JSON a safetensors header uses: objects, strings, arrays and
// non-negative integers. Anything else (floats, negatives, true/false/null) is rejected.
class JsonReader {
 public:
  JsonReader(std::string_view text, std::string where) : s_(text), where_(std::move(where)) {}

  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw IoError(detail::str(where_, args..., " (header byte ", pos_, ")"));
  }

  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool consume(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) return ++pos_, true;
    return false;
  }
  void expect(char c) {
    if (!consume(c)) {
      if (pos_ >= s_.size()) fail("expected '", c, "' but the header ended");
      fail("expected '", c, "', found '", s_[pos_], "'");
    }
  }
  bool at_end() {
    skip_ws();
    return pos_ == s_.size();
  }

  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<uint8_t>(c) < 0x20) fail("raw control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      char e = s_[pos_++];
      if (e == 'u') {
        append_utf8(out, code_point());
        continue;
      }
      static constexpr std::string_view kEscaped = "\"\\/bfnrt", kMeaning = "\"\\/\b\f\n\r\t";
      size_t k = kEscaped.find(e);
      if (k == std::string_view::npos) fail("invalid escape '\\", e, "'");
      out += kMeaning[k];
    }
  }

  uint64_t uint() {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == '-') fail("negative numbers are not allowed");
    size_t start = pos_;
    uint64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      if (__builtin_mul_overflow(v, 10u, &v) ||
          __builtin_add_overflow(v, static_cast<uint64_t>(s_[pos_] - '0'), &v)) {
        fail("integer ", s_.substr(start, pos_ + 1 - start), "... overflows 64 bits");
      }
      ++pos_;
    }
    if (pos_ == start) fail("expected a non-negative integer");
    if (s_[start] == '0' && pos_ - start > 1)
      fail("leading zeros in ", s_.substr(start, pos_ - start));
    if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E')) {
      fail("only integers are allowed, found a fraction or exponent after ", v);
    }
    return v;
  }

  std::vector<uint64_t> uint_array() {
    std::vector<uint64_t> out;
    expect('[');
    if (consume(']')) return out;
    do out.push_back(uint());
    while (consume(','));
    expect(']');
    return out;
  }

 private:
  uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char h = s_[pos_++];
      int d = h >= '0' && h <= '9'   ? h - '0'
              : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                     : -1;
      if (d < 0) fail("bad hex digit '", h, "' in a \\u escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }
  // One \uXXXX (the "\u" already read), joining a UTF-16 surrogate pair.
  uint32_t code_point() {
    uint32_t hi = hex4();
    if (hi >= 0xdc00 && hi <= 0xdfff) fail("unpaired low surrogate in a \\u escape");
    if (hi < 0xd800 || hi > 0xdbff) return hi;
    if (pos_ + 2 > s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') {
      fail("high surrogate not followed by a low one");
    }
    pos_ += 2;
    uint32_t lo = hex4();
    if (lo < 0xdc00 || lo > 0xdfff) fail("high surrogate not followed by a low one");
    return 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
  }
  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  std::string_view s_;
  std::string where_;
  size_t pos_ = 0;
};

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

Entry parse_entry(JsonReader& r, std::string name) {
  Entry e{std::move(name), kFloat32, {}, 0, 0};
  bool has_dtype = false, has_shape = false, has_offsets = false;
  r.expect('{');
  do {
    std::string key = r.string();
    r.expect(':');
    auto once = [&](bool& seen) {
      if (seen) r.fail("tensor \"", e.name, "\" has a duplicate key \"", key, "\"");
      seen = true;
    };
    if (key == "dtype") {
      once(has_dtype);
      std::string d = r.string();
      auto t = parse_safetensors_dtype(d);
      if (!t) r.fail("tensor \"", e.name, "\" has unsupported dtype \"", d, "\"");
      e.dtype = *t;
    } else if (key == "shape") {
      once(has_shape);
      for (uint64_t s : r.uint_array()) {
        if (s > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          r.fail("tensor \"", e.name, "\" has size ", s, " out of range");
        }
        e.shape.push_back(static_cast<int64_t>(s));
      }
      if (e.shape.size() > kMaxDims) {
        r.fail("tensor \"", e.name, "\" has ", e.shape.size(), " dims, more than ", kMaxDims);
      }
    } else if (key == "data_offsets") {
      once(has_offsets);
      auto offs = r.uint_array();
      if (offs.size() != 2)
        r.fail("tensor \"", e.name, "\" needs 2 data_offsets, got ", offs.size());
      e.begin = offs[0];
      e.end = offs[1];
    } else {
      r.fail("tensor \"", e.name, "\" has unknown key \"", key, "\"");
    }
  } while (r.consume(','));
  r.expect('}');
  if (!has_dtype || !has_shape || !has_offsets) {
    r.fail("tensor \"", e.name, "\" lacks ",
           !has_dtype   ? "\"dtype\""
           : !has_shape ? "\"shape\""
                        : "\"data_offsets\"");
  }
  return e;
}

std::map<std::string, std::string> parse_metadata(JsonReader& r) {
  std::map<std::string, std::string> out;
  r.expect('{');
  if (r.consume('}')) return out;
  do {
    std::string key = r.string();
    r.expect(':');
    std::string value = r.string();
    if (!out.emplace(std::move(key), std::move(value)).second) {
      r.fail("duplicate __metadata__ key");
    }
  } while (r.consume(','));
  r.expect('}');
  return out;
}

// The 8-byte header length of a file of `size` bytes, checked against it.
uint64_t checked_header_length(const uint8_t* first8, uint64_t size, const std::string& where) {
  GW_CHECK(size >= 8, IoError, where, size, " bytes is too short for the 8-byte header length");
  uint64_t n = get_u64(first8);
  GW_CHECK(n <= size - 8, IoError, where, "header length ", n, " exceeds the ", size - 8,
           " bytes that follow it");
  GW_CHECK(n <= kMaxHeaderBytes, IoError, where, "header length ", n, " exceeds the limit of ",
           kMaxHeaderBytes);
  return n;
}

struct Header {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
};

// Parses and checks a safetensors header (the JSON after the length) for a data section of
// `data_size` bytes; `where` prefixes every error message.
Header parse_header(std::string_view text, uint64_t data_size, const std::string& where) {
  GW_CHECK(valid_utf8(text), IoError, where, "the header is not valid UTF-8");
  JsonReader r(text, where);
  std::vector<Entry> entries;
  std::map<std::string, std::string> meta;
  std::set<std::string> names;
  bool has_meta = false;
  r.expect('{');
  if (!r.consume('}')) {
    do {
      std::string name = r.string();
      r.expect(':');
      if (name == "__metadata__") {
        if (has_meta) r.fail("duplicate \"__metadata__\"");
        has_meta = true;
        meta = parse_metadata(r);
      } else {
        if (!names.insert(name).second) r.fail("duplicate tensor name \"", name, "\"");
        entries.push_back(parse_entry(r, std::move(name)));
      }
    } while (r.consume(','));
    r.expect('}');
  }
  if (!r.at_end()) r.fail("trailing bytes after the header object");

  for (const Entry& e : entries) {
    auto nbytes = checked_nbytes(e.shape, e.dtype);
    GW_CHECK(nbytes.has_value(), IoError, where, "tensor \"", e.name, "\" of shape ",
             shape_str(e.shape), " overflows the byte count");
    GW_CHECK(e.begin <= e.end && e.end <= data_size, IoError, where, "tensor \"", e.name,
             "\" has data_offsets [", e.begin, ", ", e.end, "] outside the data section of ",
             data_size, " bytes");
    GW_CHECK(e.end - e.begin == *nbytes, IoError, where, "tensor \"", e.name, "\" has ",
             e.end - e.begin, " data bytes but ", e.dtype, " ", shape_str(e.shape), " needs ",
             *nbytes);
  }
  // Names are unique and byte ranges disjoint (empty tensors occupy no bytes).
  std::vector<const Entry*> order;
  for (const Entry& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  const Entry* prev = nullptr;
  for (const Entry* e : order) {
    if (e->begin == e->end) continue;
    GW_CHECK(prev == nullptr || e->begin >= prev->end, IoError, where, "tensors \"", prev->name,
             "\" [", prev->begin, ", ", prev->end, ") and \"", e->name, "\" [", e->begin, ", ",
             e->end, ") overlap");
    prev = e;
  }
  return {std::move(entries), std::move(meta)};
}

// Parses and checks a whole safetensors buffer; `where` prefixes every error message.
NamedTensors parse_safetensors(std::span<const uint8_t> bytes, const std::string& where,
                               std::map<std::string, std::string>* metadata) {
  const uint64_t n = checked_header_length(bytes.data(), bytes.size(), where);
  std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), n);
  std::span<const uint8_t> data = bytes.subspan(8 + n);
  Header header = parse_header(text, data.size(), where);
  NamedTensors out;
  for (const Entry& e : header.entries) {
    out.emplace(e.name, tensor_from_bytes(data.data() + e.begin, e.shape, e.dtype));
  }
  if (metadata) *metadata = std::move(header.metadata);
  return out;
}

[[noreturn]] void throw_errno(const char* op, const std::string& path, const char* what) {
  int err = errno;
  throw IoError(detail::str("[", op, "] cannot ", what, " \"", path, "\": ", std::strerror(err)));
}

}  // namespace

std::vector<uint8_t> to_safetensors(const NamedTensors& tensors,
                                    const std::map<std::string, std::string>& metadata) {
  std::vector<Tensor> hosts;
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      if (header.back() != '{') header += ',';
      append_json_string(header, k, "to_safetensors");
      header += ':';
      append_json_string(header, v, "to_safetensors");
    }
    header += '}';
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {  // std::map: name order
    GW_CHECK(name != "__metadata__", InvalidArgumentError,
             "[to_safetensors] \"__metadata__\" is reserved and cannot name a tensor");
    GW_CHECK(t.defined(), InvalidArgumentError, "[to_safetensors] tensor \"", name,
             "\" is undefined");
    hosts.push_back(host_contiguous(t));
    const Tensor& h = hosts.back();
    if (header.size() > 1) header += ',';
    append_json_string(header, name, "to_safetensors");
    header += detail::str(":{\"dtype\":\"", safetensors_dtype(h.dtype()), "\",\"shape\":[");
    for (int64_t i = 0; i < h.dim(); ++i) header += detail::str(i ? "," : "", h.size(i));
    header += detail::str("],\"data_offsets\":[", offset, ",", offset + h.nbytes(), "]}");
    offset += h.nbytes();
  }
  header += '}';
  // The reference writer pads with spaces so that the data section starts 8-byte aligned.
  header.append((8 - header.size() % 8) % 8, ' ');

  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + offset);
  put_u64(out, header.size());
  out.insert(out.end(), header.begin(), header.end());
  for (const Tensor& h : hosts) {
    const auto* p = static_cast<const uint8_t*>(h.raw_data());
    if (h.nbytes() > 0) out.insert(out.end(), p, p + h.nbytes());
  }
  return out;
}

NamedTensors from_safetensors(std::span<const uint8_t> bytes,
                              std::map<std::string, std::string>* metadata) {
  return parse_safetensors(bytes, "[from_safetensors] ", metadata);
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<uint8_t> bytes = to_safetensors(tensors, metadata);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw_errno("save_safetensors", path, "open");
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  int write_errno = errno;
  if (std::fclose(f) != 0 && ok) throw_errno("save_safetensors", path, "close");
  errno = write_errno;
  if (!ok) throw_errno("save_safetensors", path, "write");
}

NamedTensors load_safetensors(const std::string& path,
                              std::map<std::string, std::string>* metadata) {
  // Reads the whole file: simple, and the copies into fresh storages follow immediately.
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw_errno("load_safetensors", path, "open");
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.insert(bytes.end(), buf, buf + got);
  bool failed = std::ferror(f) != 0;
  int read_errno = errno;
  std::fclose(f);
  errno = read_errno;
  if (failed) throw_errno("load_safetensors", path, "read");
  return parse_safetensors(bytes, "[load_safetensors] " + path + ": ", metadata);
}

// --- reading parts of a safetensors file -----------------------------------------------------

namespace {
// pread of exactly `size` bytes at `offset`; false on an error or a short file.
bool read_fully(int fd, void* out, size_t size, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(out);
  while (size > 0) {  // bounded: each round reads at least one byte or stops
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    p += n, size -= static_cast<size_t>(n), offset += static_cast<uint64_t>(n);
  }
  return true;
}
}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const std::string where = "[SafetensorsFile] " + path + ": ";
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw_errno("SafetensorsFile", path, "open");
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw_errno("SafetensorsFile", path, "stat");
    const auto size = static_cast<uint64_t>(st.st_size);
    uint8_t first8[8] = {};
    if (size >= 8 && !read_fully(fd_, first8, 8, 0)) throw_errno("SafetensorsFile", path, "read");
    const uint64_t n = checked_header_length(first8, size, where);
    std::string text(n, '\0');
    if (!read_fully(fd_, text.data(), n, 8)) throw_errno("SafetensorsFile", path, "read");
    Header header = parse_header(text, size - 8 - n, where);
    data_start_ = 8 + n;
    for (Entry& e : header.entries) {
      begins_.emplace(e.name, e.begin);
      tensors_.emplace(std::move(e.name), Info{e.dtype, std::move(e.shape)});
    }
    metadata_ = std::move(header.metadata);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { ::close(fd_); }

const SafetensorsFile::Info& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  GW_CHECK(it != tensors_.end(), IndexError, "[SafetensorsFile] ", path_, " has no tensor \"", name,
           "\"");
  return it->second;
}

void SafetensorsFile::read(const std::string& name, int64_t offset, int64_t count,
                           void* out) const {
  const Info& t = info(name);
  const int64_t numel = gw::numel(t.shape);
  GW_CHECK(offset >= 0 && count >= 0 && offset <= numel && count <= numel - offset, IndexError,
           "[SafetensorsFile] ", path_, ": elements [", offset, ", ", offset + count,
           ") are outside tensor \"", name, "\" of ", numel);
  const uint64_t item = itemsize(t.dtype);
  const uint64_t at = data_start_ + begins_.at(name) + static_cast<uint64_t>(offset) * item;
  if (count > 0 && !read_fully(fd_, out, static_cast<size_t>(count) * item, at))
    throw_errno("SafetensorsFile", path_, "read");
}

Tensor SafetensorsFile::read(const std::string& name) const {
  const Info& t = info(name);
  Tensor out = empty(t.shape, t.dtype);
  read(name, 0, out.numel(), out.raw_data());
  return out;
}

}  // namespace gw
