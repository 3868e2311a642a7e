// mpopt — the spike guard's cold definitions (spike_guard.hpp): inline header-only, else compiled
// once by <mpopt/src.hpp>.
#pragma once

#include "spike_guard.hpp"

#include <algorithm>

namespace mpopt::detail {

MPOPT_DECL std::vector<double> value_window::save() const {
  std::vector<double> a;
  for (std::size_t i = 0; i < count_; ++i) a.push_back(at(i));
  return a;
}

MPOPT_DECL void value_window::load(const std::vector<double>& saved) {
  first_ = 0;
  count_ = std::min(saved.size(), values_.size());
  std::copy(saved.end() - std::ptrdiff_t(count_), saved.end(), values_.begin());
}

MPOPT_DECL void spike_guard::restore(const saved& s) {
  loss_.load(s.loss);
  norm_.load(s.norm);
  loss_sum_ = 0;
  verdict_ = spike::none;
}

}  // namespace mpopt::detail
