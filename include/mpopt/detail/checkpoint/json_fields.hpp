// mpopt — fields of checkpoint metadata, read with an exact type and range check. A file can hold
// anything JSON can: 1e30 where a counter belongs (converting it to an integer is undefined
// behaviour), -1 (which wraps), a string. Each read throws mpopt::error naming the field instead.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "../config.hpp"
#include "../options/validate.hpp"

namespace mpopt::detail {

/// parent[key], which must exist; `name` is the field as messages call it (key when empty).
MPOPT_DECL const nlohmann::json& json_field(const nlohmann::json& parent, std::string_view key,
                                            std::string_view name = {});

/// A count in [0, hi], written as a JSON integer: never a float, a string or a bool.
MPOPT_DECL std::uint64_t json_count(const nlohmann::json& parent, std::string_view key, std::uint64_t hi,
                                    std::string_view name = {});

/// An integer in [lo, hi], written as a JSON integer.
MPOPT_DECL std::int64_t json_integer(const nlohmann::json& parent, std::string_view key, std::int64_t lo,
                                     std::int64_t hi, std::string_view name = {});

/// A number (integer or float; JSON has no infinities), as a double. Ranges are the options' checks.
MPOPT_DECL double json_number(const nlohmann::json& parent, std::string_view key, std::string_view name = {});

/// true or false, nothing else (not 0 or 1).
MPOPT_DECL bool json_flag(const nlohmann::json& parent, std::string_view key, std::string_view name = {});

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "json_fields.ipp"
#endif
