// Two byte formats for tensors: gradwire's own compact one (serialize/deserialize) and Hugging
// Face safetensors. Readers treat their input as hostile: every length, offset and dtype is
// checked before it is used, and any problem is an IoError naming the field and its value.
#include "core/serialize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

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

// Refuses bool data with a byte other than 0 or 1 (a bool holding 2 is undefined behaviour: it
// reads as true and as not true), naming `what` ("[load_safetensors] f.safetensors: tensor
// \"mask\"") and the element, counted from `first`.
void check_bools(const void* data, size_t n, const std::string& what, int64_t first = 0) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  const auto* bad = std::find_if(bytes, bytes + n, [](uint8_t b) { return b > 1; });
  GW_CHECK(bad == bytes + n, IoError, what, ": bool element ", first + (bad - bytes), " is byte ",
           static_cast<int>(*bad), ", not 0 or 1");
}

// A fresh tensor that owns a copy of `data` (the caller checked the length); `what` names it
// in an error.
Tensor tensor_from_bytes(const uint8_t* data, const Shape& shape, DType dtype,
                         const std::string& what) {
  Tensor t = empty(shape, dtype);
  if (dtype == kBool) check_bools(data, t.nbytes(), what);
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
  return tensor_from_bytes(bytes.data() + header, shape, dtype, "[deserialize] the tensor");
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

// A byte for an error message: 'c' when printable ASCII, its hex value otherwise.
std::string shown(char ch) {
  auto c = static_cast<uint8_t>(ch);
  if (c > 0x20 && c < 0x7f) return detail::str('\'', ch, '\'');
  char buf[16];
  std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
  return buf;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

struct Header {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
};

// Reads a safetensors header through nlohmann's SAX parser. nlohmann reads the JSON and words
// its syntax errors itself; this class checks each event against the schema as it arrives, so
// no document tree is built (a hostile header costs no more memory than the entries it
// declares), duplicate keys are seen (nlohmann's tree would keep only the last) and the first
// problem in text order is the one reported. depth_ counts the open containers: 1 inside the
// header object, 2 inside an entry or "__metadata__", 3 inside "shape" or "data_offsets".
class HeaderReader final : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit HeaderReader(const std::string& where) : where_(where) {}

  Header header;

  bool start_object(std::size_t) override {
    if (depth_ > 1) mismatch("'{'");
    if (depth_++ == 1 && !in_meta_) {
      entry_ = Entry{member_, kFloat32, {}, 0, 0};
      seen_ = {};
    }
    return true;
  }

  bool key(string_t& k) override {
    if (depth_ == 1) {  // a tensor name or "__metadata__"
      in_meta_ = k == "__metadata__";
      if (in_meta_ && std::exchange(has_meta_, true)) fail("duplicate \"__metadata__\"");
      if (!in_meta_ && !names_.insert(k).second) fail("duplicate tensor name \"", k, "\"");
      member_ = std::move(k);
    } else if (in_meta_) {
      if (header.metadata.count(k)) fail("duplicate __metadata__ key \"", k, "\"");
      meta_key_ = std::move(k);
    } else {
      auto it = std::find(std::begin(kFields), std::end(kFields), k);
      if (it == std::end(kFields)) fail("tensor \"", member_, "\" has unknown key \"", k, "\"");
      field_ = static_cast<Field>(it - std::begin(kFields));
      if (std::exchange(seen_[field_], true)) {
        fail("tensor \"", member_, "\" has a duplicate key \"", k, "\"");
      }
    }
    return true;
  }

  bool end_object() override {
    if (--depth_ == 1 && !in_meta_) {  // an entry is complete
      for (Field f : {kDtype, kShape, kOffsets}) {
        if (!seen_[f]) fail("tensor \"", member_, "\" lacks \"", kFields[f], "\"");
      }
      header.entries.push_back(std::move(entry_));
    }
    return true;
  }

  bool start_array(std::size_t) override {
    if (depth_ != 2 || in_meta_ || field_ == kDtype) mismatch("'['");
    values_.clear();
    count_ = 0;
    ++depth_;
    return true;
  }

  bool end_array() override {  // only "shape" and "data_offsets" get here
    --depth_;
    if (field_ == kOffsets) {
      if (count_ != 2) fail("tensor \"", member_, "\" needs 2 data_offsets, got ", count_);
      entry_.begin = values_[0];
      entry_.end = values_[1];
      return true;
    }
    if (count_ > kMaxDims) {
      fail("tensor \"", member_, "\" has ", count_, " dims, more than ", kMaxDims);
    }
    for (uint64_t s : values_) {
      if (s > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail("tensor \"", member_, "\" has size ", s, " out of range");
      }
      entry_.shape.push_back(static_cast<int64_t>(s));
    }
    return true;
  }

  // nlohmann reports a non-negative integer as unsigned, one with a '-' (even -0) as signed,
  // and one with a fraction, an exponent or too many digits for 64 bits as a float.
  bool number_unsigned(number_unsigned_t v) override {
    if (depth_ != 3) mismatch(detail::str(v));
    if (values_.size() < kMaxDims) values_.push_back(v);  // the count alone past that
    ++count_;
    return true;
  }
  bool number_integer(number_integer_t v) override {
    if (depth_ == 3) fail(context(), "negative numbers are not allowed");
    mismatch(detail::str(v));
  }
  bool number_float(number_float_t, const string_t& s) override {
    if (depth_ != 3) mismatch(s);
    if (s.starts_with('-')) fail(context(), "negative numbers are not allowed, found ", s);
    if (s.find_first_of(".eE") == std::string::npos) {
      fail(context(), "integer ", s, " overflows 64 bits");
    }
    fail(context(), "only integers are allowed, found a fraction or exponent in ", s);
  }

  bool string(string_t& s) override {
    if (depth_ == 2 && in_meta_) {
      header.metadata.emplace(std::move(meta_key_), std::move(s));
      return true;
    }
    if (depth_ != 2 || field_ != kDtype) mismatch("a string");
    auto t = parse_safetensors_dtype(s);
    if (!t) fail("tensor \"", member_, "\" has unsupported dtype \"", s, "\"");
    entry_.dtype = *t;
    return true;
  }
  bool null() override { mismatch("null"); }
  bool boolean(bool b) override { mismatch(b ? "true" : "false"); }
  bool binary(binary_t&) override { mismatch("binary data"); }  // not from JSON text

  // A syntax error, in nlohmann's words; `pos` counts the bytes read.
  bool parse_error(std::size_t pos, const std::string&,
                   const nlohmann::json::exception& e) override {
    fail(e.what(), " (header byte ", pos > 0 ? pos - 1 : 0, ")");
  }

 private:
  enum Field { kDtype, kShape, kOffsets };
  static constexpr std::string_view kFields[] = {"dtype", "shape", "data_offsets"};

  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw IoError(detail::str(where_, args...));
  }
  // "<whose value>: expected <what the schema wants here>, found <found>".
  [[noreturn]] void mismatch(const std::string& found) const {
    const char* want = depth_ <= 1                    ? "'{'"
                       : depth_ == 3                  ? "a non-negative integer"
                       : in_meta_ || field_ == kDtype ? "'\"'"
                                                      : "'['";
    fail(context(), "expected ", want, ", found ", found);
  }
  std::string context() const {
    if (in_meta_) {
      return depth_ == 1 ? "\"__metadata__\": " : "__metadata__ key \"" + meta_key_ + "\": ";
    }
    if (depth_ == 1) return "tensor \"" + member_ + "\": ";
    return detail::str("tensor \"", member_, "\", key \"", kFields[field_], "\": ");
  }

  const std::string& where_;
  int depth_ = 0;
  bool in_meta_ = false, has_meta_ = false;
  std::string member_, meta_key_;  // the current tensor name; the current metadata key
  std::set<std::string> names_;
  Entry entry_;
  Field field_ = kDtype;
  std::array<bool, 3> seen_{};
  std::vector<uint64_t> values_;  // of the current array, at most kMaxDims of them
  size_t count_ = 0;              // of the current array, all of them
};

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

// Parses and checks a safetensors header (the JSON after the length) for a data section of
// `data_size` bytes; `where` prefixes every error message.
Header parse_header(std::string_view text, uint64_t data_size, const std::string& where) {
  GW_CHECK(valid_utf8(text), IoError, where, "the header is not valid UTF-8");
  // nlohmann would skip a byte-order mark; a header has none, so '{' comes first.
  const size_t first = text.find_first_not_of(" \t\n\r");
  GW_CHECK(first != std::string_view::npos, IoError, where, "expected '{' but the header ended");
  GW_CHECK(text[first] == '{', IoError, where, "expected '{', found ", shown(text[first]),
           " (header byte ", first, ")");
  // The reader throws every error, syntax errors included; nlohmann's SAX parser throws none.
  HeaderReader reader(where);
  GW_CHECK(nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &reader), IoError,
           where, "malformed header");
  std::vector<Entry>& entries = reader.header.entries;

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
  return std::move(reader.header);
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
    out.emplace(e.name, tensor_from_bytes(data.data() + e.begin, e.shape, e.dtype,
                                          where + "tensor \"" + e.name + "\""));
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

uint64_t safetensors_header_length(std::span<const uint8_t> bytes) {
  return checked_header_length(bytes.data(), bytes.size(), "[safetensors] ");
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

NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata,
                              std::vector<uint8_t>* file) {
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
  NamedTensors tensors = parse_safetensors(bytes, "[load_safetensors] " + path + ": ", metadata);
  if (file) *file = std::move(bytes);
  return tensors;
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
  if (t.dtype == kBool)
    check_bools(out, static_cast<size_t>(count),
                "[SafetensorsFile] " + path_ + ": tensor \"" + name + "\"", offset);
}

Tensor SafetensorsFile::read(const std::string& name) const {
  const Info& t = info(name);
  Tensor out = empty(t.shape, t.dtype);
  read(name, 0, out.numel(), out.raw_data());
  return out;
}

}  // namespace gw
