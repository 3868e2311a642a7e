// mpopt — the cross-rank settings' definitions (same_settings.hpp): inline header-only, else
// compiled once by <mpopt/src.hpp>.
#pragma once

#include "same_settings.hpp"

#include <algorithm>

#include "../checkpoint/checksum.hpp"

namespace mpopt::detail {

/// A setting's text as the ranks compare it.
MPOPT_DECL std::uint64_t text_hash(std::string_view text) {
  checksum64 sum(text.size());
  sum.update(std::as_bytes(std::span(text)));
  return sum.finish();
}

MPOPT_DECL void require_same_settings(cold_collectives& comm, std::span<const setting> settings,
                                      std::string_view advice) {
  const std::size_t n = settings.size();
  // Per setting the largest hash of any rank, then the largest complement (the smallest hash):
  // where they differ, every rank sees it.
  std::vector<std::uint64_t> mine(n), seen(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    mine[i] = text_hash(settings[i].value);
    seen[i] = mine[i];
    seen[n + i] = ~mine[i];
  }
  comm.all_reduce_max(std::span<std::uint64_t>(seen));
  std::vector<std::size_t> differing;
  for (std::size_t i = 0; i < n; ++i)
    if (seen[i] != mine[i] || seen[n + i] != ~mine[i]) differing.push_back(i);
  if (differing.empty()) return;

  // Every rank's value of the first few, as fixed-size records gathered from all ranks.
  constexpr std::size_t shown = 4, width = 48;
  const std::size_t k = std::min(shown, differing.size()), w = std::size_t(comm.size()), r = std::size_t(comm.rank());
  std::vector<std::uint8_t> records(w * k * width, 0);
  for (std::size_t j = 0; j < k; ++j) {
    std::string v = settings[differing[j]].value;
    if (v.size() >= width) v = v.substr(0, width - 4) + "...";
    std::copy(v.begin(), v.end(), records.begin() + std::ptrdiff_t((r * k + j) * width));
  }
  const std::vector<std::size_t> counts(w, k * width);
  comm.all_gather(std::span<std::uint8_t>(records), std::span<const std::size_t>(counts));

  std::string message = "the ranks disagree on ";
  for (std::size_t j = 0; j < k; ++j) {
    auto value_of = [&](std::size_t rank) {
      const auto* at = reinterpret_cast<const char*>(records.data() + (rank * k + j) * width);
      return std::string(at, std::find(at, at + width, '\0'));
    };
    message += (j ? "; " : "") + settings[differing[j]].name + " (";
    std::vector<bool> told(w, false);
    for (std::size_t a = 0; a < w; ++a) {  // ranks holding the same value, together
      if (told[a]) continue;
      const std::string value = value_of(a);
      std::string ranks;
      std::size_t holders = 0;
      for (std::size_t b = a; b < w; ++b)
        if (!told[b] && value_of(b) == value) {
          told[b] = true;
          ranks += (holders++ ? ", " : "") + std::to_string(b);
        }
      message += (a ? ", " : "") + std::string(holders > 1 ? "ranks " : "rank ") + ranks + ": " + value;
    }
    message += ")";
  }
  if (differing.size() > k) message += "; and " + std::to_string(differing.size() - k) + " more";
  fail(message, ". ", advice);
}

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

MPOPT_DECL std::vector<setting> schedule_compared(const std::optional<lr_schedule>& s, std::string_view whose) {
  std::vector<setting> settings;
  for (auto& [name, value] : schedule_settings(s)) settings.push_back({std::string(whose) + name, std::move(value)});
  return settings;
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
  all.push_back({label_ + " tensors", std::to_string(tensors_) + " tensors, " + std::to_string(elements_) +
                                          " elements, hash " + checksum64::hex(text_hash(text_)).substr(0, 8)});
}

MPOPT_DECL void add_group_settings(std::vector<setting>& all, const std::string& label,
                                   std::span<const field_ref> options, const tensors_summary& tensors) {
  add_field_settings(all, label + ".", options);
  tensors.settle(all);
}

}  // namespace mpopt::detail
