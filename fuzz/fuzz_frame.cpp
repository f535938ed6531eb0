// libFuzzer target: arbitrary bytes through rpc::FrameReader, the parser rpc::Connection reads a
// peer's socket with (prefix, header, tensor allocation, payload, decode), cut into reads of
// 1 to 97 bytes (by the input's size) so that resuming at every point of a frame is exercised.
//
// A gw::Error is the decoder rejecting a bad frame: expected. Anything else is a finding: a
// crash, a sanitizer report, an exception of another type, a timeout, an oversized allocation,
// or an accepted frame that does not survive being encoded and read again unchanged.
#include <exception>

#include "fuzz/support.h"

namespace {

using gw::fuzz::read_frames;

// Re-encoding repeats a tensor once per reference to it, so a small frame can name gigabytes;
// such messages are valid but too big to check here.
constexpr size_t kMaxReencodedBytes = 16 * gw::fuzz::kMaxFrameBytes;

void check_reencodes(const gw::rpc::Message& m) {
  gw::rpc::OutgoingFrame frame = gw::rpc::encode(m);
  if (frame.total_bytes() > kMaxReencodedBytes) return;
  auto again = read_frames(gw::fuzz::frame_bytes(frame), frame.total_bytes());
  if (again.size() != 1)
    gw::fuzz::report_finding(
        gw::detail::str("re-encoded message read back as ", again.size(), " frames"));
  std::string diff = gw::fuzz::message_difference(m, again[0]);
  if (!diff.empty())
    gw::fuzz::report_finding("decode -> encode -> decode changed the message: " + diff);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<gw::rpc::Message> messages;
  try {
    messages = read_frames({data, size}, gw::fuzz::kMaxFrameBytes, 1 + size % 97);
  } catch (const gw::Error&) {
    return 0;  // rejected, as it should be for most inputs
  } catch (const std::exception& e) {
    gw::fuzz::report_finding(std::string("decoder threw a non-gw exception: ") + e.what());
  } catch (...) {
    gw::fuzz::report_finding("decoder threw something that is not a std::exception");
  }
  try {
    for (const auto& m : messages) check_reencodes(m);
  } catch (const std::exception& e) {
    gw::fuzz::report_finding(std::string("re-encoding an accepted frame threw: ") + e.what());
  } catch (...) {
    gw::fuzz::report_finding("re-encoding an accepted frame threw a non-std::exception");
  }
  return 0;
}
