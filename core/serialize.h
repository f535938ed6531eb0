// Tensors to and from bytes, and named tensors to and from safetensors files.
//
// `serialize` writes a small self-describing header (magic, dtype, shape) followed by the
// raw little-endian elements in row-major order; the RPC layer sends the same header fields
// and the raw buffer separately. safetensors is the Hugging Face format (8-byte header
// length, JSON header, raw data), so weights move to and from PyTorch:
//
//   gw::save_safetensors("model.safetensors", {{"fc.weight", w}, {"fc.bias", b}});
//   auto tensors = gw::load_safetensors("model.safetensors");  // std::map<std::string, Tensor>
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace gw {

std::vector<uint8_t> serialize(const Tensor& t);
Tensor deserialize(std::span<const uint8_t> bytes);

using NamedTensors = std::map<std::string, Tensor>;
std::vector<uint8_t> to_safetensors(const NamedTensors& tensors,
                                    const std::map<std::string, std::string>& metadata = {});
NamedTensors from_safetensors(std::span<const uint8_t> bytes,
                              std::map<std::string, std::string>* metadata = nullptr);
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// The length of a safetensors buffer's JSON header (its first 8 bytes, little-endian), checked
// against the buffer: IoError when the buffer is too short for it.
uint64_t safetensors_header_length(std::span<const uint8_t> bytes);
// With `file`, the file's bytes as read are left there too (a caller that checks them: a
// checkpoint's checksum), so that the file is read once.
NamedTensors load_safetensors(const std::string& path,
                              std::map<std::string, std::string>* metadata = nullptr,
                              std::vector<uint8_t>* file = nullptr);

}  // namespace gw
