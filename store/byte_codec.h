// Little-endian byte encoding shared by TCPStore's wire protocol and FileStore's file format.
//
// Every length read from untrusted bytes is checked against what is left and against
// kMaxFieldBytes, so a corrupt file or a hostile peer yields gw::IoError, never a huge
// allocation or a read past the end.
//
//   ByteWriter w("TCPStore::set");
//   w.u8(1); w.str("key"); w.bytes(value);
//   ByteReader r(w.take(), "TCPStore server");
//   uint8_t cmd = r.u8(); std::string key = r.str(); Bytes v = r.bytes(); r.expect_done();
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "store/store.h"

namespace gw::store::detail {

// Keys and values are capped so a bad length cannot make a reader allocate gigabytes.
inline constexpr uint32_t kMaxFieldBytes = 64u << 20;

class ByteWriter {
 public:
  // `op` names the operation in errors (a field over kMaxFieldBytes is an InvalidArgumentError).
  explicit ByteWriter(const char* op) : op_(op) {}

  void u8(uint8_t v) { buf_.push_back(v); }
  void u32(uint32_t v);
  void u64(uint64_t v);
  void bytes(const Bytes& b) { field(b.data(), b.size()); }
  void str(const std::string& s) { field(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }
  void strings(const std::vector<std::string>& v);

  const Bytes& buffer() const { return buf_; }
  Bytes take() { return std::move(buf_); }

 private:
  void field(const uint8_t* p, size_t n);

  const char* op_;
  Bytes buf_;
};

class ByteReader {
 public:
  // `what` names the source in errors: "[what] truncated: needs 8 more bytes, 3 left".
  ByteReader(Bytes data, std::string what) : data_(std::move(data)), what_(std::move(what)) {}

  uint8_t u8() { return *need(1); }
  uint32_t u32();
  uint64_t u64();
  Bytes bytes();
  std::string str();
  std::vector<std::string> strings();

  size_t remaining() const { return data_.size() - pos_; }
  // Throws IoError if bytes are left over: a frame must be exactly what its command needs.
  void expect_done() const;

 private:
  const uint8_t* need(size_t n);
  size_t field_length();

  Bytes data_;
  size_t pos_ = 0;
  std::string what_;
};

}  // namespace gw::store::detail
