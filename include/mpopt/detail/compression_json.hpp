// mpopt — the compressing rules' compression_options in checkpoints and configurations (JSON).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "../compression_options.hpp"
#include "json_fields.hpp"
#include "validate.hpp"

namespace mpopt::detail {

/// "per_tensor" or "global"; anything else is an error naming `field`.
inline compression_scale compression_scale_of(const std::string& name, std::string_view field) {
  for (const auto s : {compression_scale::per_tensor, compression_scale::global})
    if (name == compression_scale_name(s)) return s;
  fail(field, " must be \"per_tensor\" or \"global\", got \"", name, "\"");
}

inline nlohmann::json compression_json(const compression_options& o) {
  return {{"exclude_zero_variance", o.exclude_zero_variance},
          {"zero_variance_ratio", o.zero_variance_ratio},
          {"scale", compression_scale_name(o.scale)}};
}

/// parent["compression"], as compression_json writes it.
inline compression_options compression_from_json(const nlohmann::json& parent) {
  const nlohmann::json& j = json_field(parent, "compression");
  const nlohmann::json& scale = json_field(j, "scale", "compression.scale");
  if (!scale.is_string()) fail("compression.scale must be a string, got ", scale.dump());
  return {json_flag(j, "exclude_zero_variance", "compression.exclude_zero_variance"),
          json_number(j, "zero_variance_ratio", "compression.zero_variance_ratio"),
          compression_scale_of(scale.get<std::string>(), "compression.scale")};
}

}  // namespace mpopt::detail
