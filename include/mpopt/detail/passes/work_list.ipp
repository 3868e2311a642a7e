// mpopt — work_list's definitions (work_list.hpp): inline header-only, else compiled once by
// <mpopt/src.hpp>.
#pragma once

#include "work_list.hpp"

namespace mpopt::detail {

MPOPT_DECL void work_list::add(std::uint32_t tensor, std::size_t first, std::size_t last, std::size_t state,
                               std::uint32_t owner) {
  if (prefix_.empty()) prefix_.push_back(0);  // allocated on first use: an unused list holds no heap memory
  while (first_chunk_.size() <= tensor) first_chunk_.push_back(chunks_.size());
  for (std::size_t b = first; b < last;) {
    const std::size_t end = std::min(last, (b / chunk_elements + 1) * chunk_elements);
    chunks_.push_back({tensor, owner, b, end - b, state + (b - first)});
    prefix_.push_back(prefix_.back() + (end - b));
    b = end;
  }
}

MPOPT_DECL norm_segments::norm_segments(const work_list& w, std::size_t tensors) {
  std::vector<std::size_t> by_tensor{0}, run_starts, tensor_runs{0};
  bool split = false;
  for (std::size_t t = 0; t < tensors; ++t) {
    const std::size_t c0 = w.first_chunk(t), c1 = w.first_chunk(t + 1);
    for (std::size_t c = c0; c < c1; ++c)
      if (c == c0 || w[c].owner != w[c - 1].owner) {
        split = split || c != c0;
        run_starts.push_back(c);
      }
    by_tensor.push_back(c1);
    tensor_runs.push_back(run_starts.size());
  }
  if (!split) {
    first = twice(by_tensor, w.size());
    return;
  }
  runs = run_starts.size();
  run_starts.push_back(w.size());
  first = twice(run_starts, w.size());
  second = twice(tensor_runs, runs);
}

}  // namespace mpopt::detail
