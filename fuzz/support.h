// Helpers shared by the fuzz targets: read frames with the parser rpc::Connection reads its
// socket with (rpc::FrameReader, not a copy of it), turn an OutgoingFrame into its bytes on the
// socket, and compare messages field by field.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "rpc/message.h"

namespace gw::fuzz {

// Small enough that a hostile prefix cannot make the reader allocate much (the agent's
// default is far larger; the checks in parse_prefix are the same).
inline constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 20;

// Decodes every complete frame at the front of `data`, in order, through rpc::FrameReader fed in
// pieces of `chunk` bytes (as reads from a socket deliver them). A frame cut short at the end is
// dropped, as Connection would wait for more bytes. Throws whatever the reader throws
// (gw::Error).
std::vector<rpc::Message> read_frames(std::span<const uint8_t> data,
                                      uint64_t max_frame_bytes = kMaxFrameBytes,
                                      size_t chunk = 64 * 1024);

// Prefix, header and payload of `frame`, concatenated as Connection's gathered write sends them.
std::vector<uint8_t> frame_bytes(const rpc::OutgoingFrame& frame);

// An empty string when `a` and `b` carry the same message (the fields of their kind only),
// else where they first differ. Tensors compare by dtype, sizes, requires_grad and bytes;
// doubles bit for bit, so NaN payloads count.
std::string message_difference(const rpc::Message& a, const rpc::Message& b);

// Prints "gradwire fuzz finding: <what>" and aborts, so libFuzzer saves the input as a crash.
[[noreturn]] void report_finding(const std::string& what);

}  // namespace gw::fuzz
