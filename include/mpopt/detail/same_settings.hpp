// mpopt — agreement across ranks on what must be the same on every rank (policies, options,
// tensors), checked before any gradient moves. A rank whose lr or clip_grad differs would train on
// silently, its parameters drifting from the others' from the first step; one whose tensors differ
// would pair collectives of different sizes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../communicator.hpp"
#include "state_file.hpp"  // checksum64
#include "validate.hpp"

namespace mpopt::detail {

/// One thing every rank must hold alike: its name in messages, and its value as text.
struct setting {
  std::string name;
  std::string value;
};

/// Collective: returns if every rank holds the same values, else throws on every rank the same
/// message, naming up to four differing settings and which ranks hold which value. The list must
/// have the same length on every rank: compare what decides its length first, in a shorter list.
template <class Comm>
void require_same_settings(Comm& comm, std::span<const setting> settings, std::string_view advice) {
  const std::size_t n = settings.size();
  auto hash = [](const std::string& text) {
    checksum64 sum(text.size());
    sum.update(std::as_bytes(std::span(text)));
    return sum.finish();
  };
  // Per setting the largest hash of any rank, then the largest complement (the smallest hash):
  // where they differ, every rank sees it.
  std::vector<std::uint64_t> mine(n), seen(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    mine[i] = hash(settings[i].value);
    seen[i] = mine[i];
    seen[n + i] = ~mine[i];
  }
  comm.all_reduce(std::span<std::uint64_t>(seen), reduce_op::max);
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

}  // namespace mpopt::detail
