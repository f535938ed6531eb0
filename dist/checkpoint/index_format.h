// The distributed checkpoint's files, as its writer (dist_checkpoint.cpp) and its reader
// (reader.cpp) both know them: index.json's format names and checksums, and the helpers that read
// what it records. Private to dist/checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace gw::dist::checkpoint::detail {

// Format 2 records checksums (CRC-32C): the index's of its own text, and each chunk's of its
// bytes, a block at a time. Format 1, without them, is read still, unchecked.
inline constexpr const char* kFormat = "gradwire-distributed-checkpoint-2";
inline constexpr const char* kFormat1 = "gradwire-distributed-checkpoint-1";
inline constexpr const char* kIndex = "index.json";
// A chunk's bytes are summed kCrcBlock at a time, so that a rank reading part of a chunk checks
// what it read with at most a block more read at either end.
inline constexpr int64_t kCrcBlock = int64_t{1} << 20;

// Where the digits of the index's own checksum, of value `value`, start in its text; npos when
// they are not there. The index is written with dump(1), its keys in order: "crc32c" first.
size_t checksum_digits(const std::string& text, const std::string& value);
// `text`'s CRC-32C with the digits at `at` (8 of them) read as zeros.
std::string index_checksum(std::string text, size_t at);
// The elements of `shape`, or nullopt when a size is negative or the product leaves int64.
std::optional<int64_t> checked_numel(const Shape& shape);
Shape shape_of(const nlohmann::json& j);
std::optional<DType> parse_dtype(std::string_view s);
// The generation of the index in `dir`, or 0 when there is none (or it cannot be read).
int64_t index_generation(const std::string& dir);

}  // namespace gw::dist::checkpoint::detail
