// Every bit of an optimizer a user can see, as bytes: to prove two optimizers alike, or that an
// operation (a refused load, a skipped step) changed nothing. Generic over what the rule declares:
// each of its state buffers and, for a reducing rule, what it keeps per tensor.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <mpopt/detail/options/fields_json.hpp>
#include <mpopt/rule.hpp>

template <class T>
std::vector<unsigned char> bytes_of(std::span<const T> s) {
  std::vector<unsigned char> b(s.size_bytes());
  if (!b.empty()) std::memcpy(b.data(), s.data(), b.size());
  return b;
}

struct optimizer_snapshot {
  std::vector<std::vector<unsigned char>> params, masters;
  std::vector<std::vector<unsigned char>> state;  // per tensor, each of the rule's buffers in turn
  std::vector<unsigned char> tensor_state;
  std::vector<std::uint64_t> group_steps;
  std::vector<std::string> group_options;
  std::vector<std::size_t> group_sizes;
  std::uint64_t scale_bits = 0;
  std::string scaler;
  bool operator==(const optimizer_snapshot&) const = default;
};

/// The snapshot of `opt`, whose parameter tensors (in registration order) are `params`.
template <class Opt, class Params>
optimizer_snapshot snapshot_of(Opt& opt, const Params& params) {
  using rule = typename Opt::rule;
  optimizer_snapshot s;
  for (const auto& p : params) s.params.push_back(bytes_of(std::span<const typename Opt::param_type>(p)));
  for (std::size_t i = 0; i < opt.tensor_count(); ++i) {
    s.masters.push_back(bytes_of(opt.master(i)));
    for (std::size_t k = 0; k < rule::state.size(); ++k) s.state.push_back(bytes_of(opt.moment(k, i)));
  }
  if constexpr (mpopt::reducing_rule<rule>) s.tensor_state = bytes_of(opt.tensor_state());
  for (std::size_t g = 0; g < opt.group_count(); ++g) {
    s.group_steps.push_back(opt.group(g).step());
    s.group_options.push_back(mpopt::detail::options_text(opt.group(g).options()));
    s.group_sizes.push_back(opt.group(g).size());
  }
  s.scale_bits = std::bit_cast<std::uint64_t>(opt.loss_scale());
  s.scaler = mpopt::detail::options_text(opt.scaler().save());
  return s;
}
