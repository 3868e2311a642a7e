// mpopt — the cross-rank settings' definitions (same_settings.hpp): inline header-only, else
// compiled once by <mpopt/src.hpp>.
#pragma once

#include "same_settings.hpp"

namespace mpopt::detail {

MPOPT_DECL std::string policies_text(std::initializer_list<std::string_view> names, std::string_view sums,
                                     std::string_view sent) {
  std::string text;
  for (const std::string_view n : names) (text += n) += ' ';
  text.pop_back();
  return text + ", sums in " + std::string(sums) + ", sent in " + std::string(sent);
}

MPOPT_DECL void add_field_settings(std::vector<setting>& all, const std::string& prefix,
                                   std::span<const field_ref> fields) {
  for (const field_ref& f : fields) {
    const std::string name = prefix + std::string(f.name);
    if (f.kind == field_kind::group) add_field_settings(all, name + ".", f.members(f.at));
    else all.push_back({name, field_text(f)});
  }
}

MPOPT_DECL std::vector<setting> option_settings(const optimizer_options& o, std::string_view rounding) {
  std::vector<setting> all;
  add_field_settings(all, "", field_refs(o));
  all.push_back({"rounding", std::string(rounding)});
  return all;
}

MPOPT_DECL std::vector<setting> settings_shape(const std::string& policies, std::size_t groups) {
  return {{"policies", policies}, {"number of groups", std::to_string(groups)}};
}

MPOPT_DECL std::vector<setting> pipeline_settings(const optimizer_options& o, std::string_view rounding,
                                                  std::string_view scaler,
                                                  std::span<const field_ref> scaler_options,
                                                  std::span<const field_ref> scaler_state, std::string_view comm,
                                                  std::optional<bool> deterministic) {
  std::vector<setting> all = option_settings(o, rounding);
  add_field_settings(all, std::string(scaler) + ".", scaler_options);
  add_field_settings(all, std::string(scaler) + " state.", scaler_state);
  if (deterministic) all.push_back({std::string(comm) + ".deterministic", *deterministic ? "true" : "false"});
  return all;
}

MPOPT_DECL void tensors_summary::add(const std::string& name, std::size_t size, const tensor_shape& shape) {
  text_ += (replicas_ ? std::string() : name) + ":" + std::to_string(size);
  for (const std::int64_t d : shape.dims()) {
    text_ += ',';  // not "," + to_string(d): g++ 12 warns -Wrestrict on that (a false positive)
    text_ += std::to_string(d);
  }
  text_ += ";";
  elements_ += size;
  ++tensors_;
}

MPOPT_DECL void tensors_summary::settle(std::vector<setting>& all) const {
  all.push_back({label_ + " data-parallel over",
                 replicas_ ? std::to_string(replicas_) + " ranks (expert group)" : "every rank"});
  checksum64 sum(text_.size());
  sum.update(std::as_bytes(std::span(text_)));
  all.push_back({label_ + " tensors", std::to_string(tensors_) + " tensors, " + std::to_string(elements_) +
                                          " elements, hash " + checksum64::hex(sum.finish()).substr(0, 8)});
}

MPOPT_DECL void add_group_settings(std::vector<setting>& all, const std::string& label,
                                   std::span<const field_ref> options, const tensors_summary& tensors) {
  add_field_settings(all, label + ".", options);
  tensors.settle(all);
}

}  // namespace mpopt::detail
