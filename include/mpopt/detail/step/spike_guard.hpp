// mpopt — the loss-spike guard (optimizer_options::spike_guard): llm.c's outlier detector. Each
// boundary's mean loss and global gradient norm join a window of the last values; a step whose
// value lies more than z standard deviations above the window's mean is held, changing nothing.
// Every rank scores the same all-reduced values, so all hold the same steps.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../../options.hpp"
#include "../config.hpp"
#include "../math/step_decision.hpp"

namespace mpopt::detail {

/// The last n finite values of a series.
class value_window {
 public:
  explicit value_window(std::size_t n = 0) : values_(n) {}

  /// Adds x and scores it, as llm.c does, against the window that now holds it: (x - mean) / std
  /// (population std; 0 when every value is equal), NaN until the window is full. A non-finite x
  /// stays out, where it would poison the next n scores, and scores +inf once the window is full.
  double add(double x) {
    const std::size_t n = values_.size();
    if (!std::isfinite(x)) return count_ == n ? std::numeric_limits<double>::infinity() : nan;
    values_[(first_ + count_) % n] = x;
    if (count_ < n) ++count_;
    else first_ = (first_ + 1) % n;
    if (count_ < n) return nan;
    // Two passes oldest first (llm.c keeps running sums, which cancel): the same bits after a resume.
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += at(i);
    const double mean = sum / double(n);
    double squares = 0;
    for (std::size_t i = 0; i < n; ++i) squares += (at(i) - mean) * (at(i) - mean);
    const double std_dev = std::sqrt(squares / double(n));
    return std_dev == 0 ? 0.0 : (x - mean) / std_dev;
  }

  /// The values, oldest first.
  MPOPT_DECL std::vector<double> save() const;
  /// The newest of `saved` (oldest first, finite; checked) that fit.
  MPOPT_DECL void load(const std::vector<double>& saved);

 private:
  static constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  double at(std::size_t i) const { return values_[(first_ + i) % values_.size()]; }
  std::vector<double> values_;  // allocated once: a step allocates nothing
  std::size_t first_ = 0, count_ = 0;
};

/// Why the guard holds a step.
enum class spike : std::uint8_t { none, loss, norm };

class spike_guard {
 public:
  explicit spike_guard(const spike_guard_options& o)
      : o_(o), loss_(o.loss_z > 0 ? std::size_t(o.window) : 0), norm_(o.norm_z > 0 ? std::size_t(o.window) : 0) {}

  bool on() const { return o_.loss_z > 0 || o_.norm_z > 0; }
  bool needs_loss() const { return o_.loss_z > 0; }

  /// The losses of an accumulation window's micro-steps, summed until its boundary.
  void new_window() { loss_sum_ = 0; }
  void fold(double loss) { loss_sum_ += loss; }
  /// The window's mean loss on this rank, its last micro-step's `loss` included.
  double window_mean(double loss, int micro_steps) const { return (loss_sum_ + loss) / double(micro_steps); }
  /// The boundary's loss judge() scores: the mean over every rank (step_pipeline.hpp, agree_on_loss).
  void set_loss(double mean) { boundary_loss_ = mean; }

  /// Scores a boundary: its loss (when guarded) and its gradient norm join their windows, whatever
  /// the step's fate (as in llm.c); then whether the step, unless the decision already skips it,
  /// is held, and why: the loss is tested first.
  spike judge(const step_decision& d) {
    loss_score_ = o_.loss_z > 0 ? loss_.add(boundary_loss_) : nan;
    norm_score_ = o_.norm_z > 0 ? norm_.add(d.norm) : nan;
    if (d.skip) return verdict_ = spike::none;
    if (loss_score_ > o_.loss_z) return verdict_ = spike::loss;  // NaN: not yet
    if (norm_score_ > o_.norm_z) return verdict_ = spike::norm;
    return verdict_ = spike::none;
  }
  spike verdict() const { return verdict_; }
  double loss_score() const { return loss_score_; }
  double norm_score() const { return norm_score_; }

  /// The windows, oldest value first: what a checkpoint keeps (saved_state.hpp checks a file's).
  struct saved {
    std::vector<double> loss, norm;
  };
  saved save() const { return {loss_.save(), norm_.save()}; }
  /// A file's windows; each keeps its newest values if this guard's window is shorter.
  MPOPT_DECL void restore(const saved& s);

 private:
  static constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  spike_guard_options o_;
  value_window loss_, norm_;
  double loss_sum_ = 0, boundary_loss_ = 0;
  double loss_score_ = nan, norm_score_ = nan;
  spike verdict_ = spike::none;
};

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "spike_guard.ipp"
#endif
