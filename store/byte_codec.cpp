#include "store/byte_codec.h"

#include "core/error.h"

namespace gw::store::detail {

void ByteWriter::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void ByteWriter::u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void ByteWriter::field(const uint8_t* p, size_t n) {
  GW_CHECK(n <= kMaxFieldBytes, InvalidArgumentError, "[", op_, "] a key or value of ", n,
           " bytes exceeds the limit of ", kMaxFieldBytes, " bytes");
  u32(static_cast<uint32_t>(n));
  buf_.insert(buf_.end(), p, p + n);
}

void ByteWriter::strings(const std::vector<std::string>& v) {
  u32(static_cast<uint32_t>(v.size()));
  for (const auto& s : v) str(s);
}

const uint8_t* ByteReader::need(size_t n) {
  GW_CHECK(n <= remaining(), IoError, "[", what_, "] truncated data: needs ", n, " more bytes, ",
           remaining(), " left");
  const uint8_t* p = data_.data() + pos_;
  pos_ += n;
  return p;
}

uint32_t ByteReader::u32() {
  const uint8_t* p = need(4);
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

uint64_t ByteReader::u64() {
  const uint8_t* p = need(8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

size_t ByteReader::field_length() {
  uint32_t n = u32();
  GW_CHECK(n <= kMaxFieldBytes, IoError, "[", what_, "] field length ", n, " exceeds the limit of ",
           kMaxFieldBytes, " bytes");
  return n;
}

Bytes ByteReader::bytes() {
  size_t n = field_length();
  const uint8_t* p = need(n);
  return Bytes(p, p + n);
}

std::string ByteReader::str() {
  size_t n = field_length();
  const char* p = reinterpret_cast<const char*>(need(n));
  return std::string(p, n);
}

std::vector<std::string> ByteReader::strings() {
  uint32_t count = u32();
  // Each string takes at least its 4-byte length, so a larger count is a lie: fail before
  // reserving memory for it.
  GW_CHECK(count <= remaining() / 4, IoError, "[", what_, "] claims ", count, " strings but only ",
           remaining(), " bytes are left");
  std::vector<std::string> v;
  v.reserve(count);
  for (uint32_t i = 0; i < count; ++i) v.push_back(str());
  return v;
}

void ByteReader::expect_done() const {
  GW_CHECK(remaining() == 0, IoError, "[", what_, "] ", remaining(), " unexpected trailing bytes");
}

}  // namespace gw::store::detail
