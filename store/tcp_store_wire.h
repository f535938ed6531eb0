// TCPStore's wire protocol, shared by the client (tcp_store.cpp) and the server.
//
// Every message is a frame: u32 body length (little-endian) + body. A request body is a command
// byte and its fields; a reply body is a status byte and its fields. Strings and values are
// u32 length + bytes, key lists are u32 count + strings (see byte_codec.h):
//
//   kSet         key, value               -> kOk
//   kGet         key, u64 timeout_ms      -> kOk value | kTimeout missing-keys
//   kAdd         key, i64 delta           -> kOk i64 | kInvalidArgument message
//   kCompareSet  key, expected, desired   -> kOk value
//   kCheck       keys                     -> kOk u8
//   kDeleteKey   key                      -> kOk u8
//   kNumKeys                              -> kOk i64
//   kWait        keys, u64 timeout_ms     -> kOk | kTimeout missing-keys
//
// A connection opens with the job-key handshake (job_key.h, Purpose::kStore: the client says
// it is "store-client", the server proves it is "store"); then it carries one request at a time.
// The server closes a connection whose frame is malformed (bad length, unknown command, trailing
// bytes).
#pragma once

#include <cstdint>

#include "store/byte_codec.h"

namespace gw::store::detail {

enum class Command : uint8_t {
  kSet = 1,
  kGet,
  kAdd,
  kCompareSet,
  kCheck,
  kDeleteKey,
  kNumKeys,
  kWait,
};

enum class Status : uint8_t { kOk = 0, kTimeout, kInvalidArgument };

// The largest legal body: compare_set carries three maximal fields.
inline constexpr uint32_t kMaxFrameBytes = 3 * (kMaxFieldBytes + 4) + 16;
inline constexpr size_t kFrameHeaderBytes = 4;

}  // namespace gw::store::detail
