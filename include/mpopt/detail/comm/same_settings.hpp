// mpopt — agreement across ranks on what must be the same on every rank (policies, options,
// tensors), checked before any gradient moves. A rank whose lr or clip_grad differs would train on
// silently, its parameters drifting from the others' from the first step; one whose tensors differ
// would pair collectives of different sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../communicator.hpp"
#include "../../lr_schedule.hpp"
#include "../../options.hpp"
#include "../../tensor_spec.hpp"
#include "collectives.hpp"
#include "../config.hpp"
#include "../options/field_refs.hpp"
#include "../options/validate.hpp"

namespace mpopt::detail {

/// One thing every rank must hold alike: its name in messages, and its value as text.
struct setting {
  std::string name;
  std::string value;
};

/// Collective: returns if every rank holds the same values, else throws on every rank the same
/// message, naming up to four differing settings and which ranks hold which value. The list must
/// have the same length on every rank: compare what decides its length first, in a shorter list.
MPOPT_DECL void require_same_settings(cold_collectives& comm, std::span<const setting> settings,
                                      std::string_view advice);
template <adapted_communicator Comm>
void require_same_settings(Comm& comm, std::span<const setting> settings, std::string_view advice) {
  collectives_of<Comm> c(comm);
  require_same_settings(static_cast<cold_collectives&>(c), settings, advice);
}


// What the optimizer's check_same_settings() compares, built by functions that do not depend on
// its policies: compiled once, not once per optimizer type.

inline constexpr std::string_view same_settings_advice =
    "Every rank must construct the optimizer with the same policies and options and register the same tensors "
    "in the same order";

/// The policies' names, then the types sums and messages use, as one setting's value.
MPOPT_DECL std::string policies_text(std::initializer_list<std::string_view> names, std::string_view sums,
                                     std::string_view sent);

/// Adds each field as a setting named prefix + its name (a nested struct's as prefix + name + ".").
MPOPT_DECL void add_field_settings(std::vector<setting>& all, const std::string& prefix,
                                   std::span<const field_ref> fields);

/// The step pipeline's options as settings; `rounding`: the precision's rounding.
MPOPT_DECL std::vector<setting> option_settings(const optimizer_options& o, std::string_view rounding);

/// A learning-rate schedule as settings (schedule_settings: as many whatever the schedule), each
/// name after `whose` ("the ", "the checkpoint's ").
MPOPT_DECL std::vector<setting> schedule_compared(const std::optional<lr_schedule>& s, std::string_view whose);

/// What decides the number of the other settings: the policies (policies_text) and the groups.
MPOPT_DECL std::vector<setting> settings_shape(const std::string& policies, std::size_t groups);

/// The step pipeline's options, the scaler's options and state (`scaler`: its name) and the
/// communicator's `deterministic`, where it has one (`comm`: its name).
MPOPT_DECL std::vector<setting> pipeline_settings(const optimizer_options& o, std::string_view rounding,
                                                  std::string_view scaler,
                                                  std::span<const field_ref> scaler_options,
                                                  std::span<const field_ref> scaler_state, std::string_view comm,
                                                  std::optional<bool> deterministic);

/// A group's tensors as two settings: who holds them, and a short summary whose hash covers every
/// name, size and shape, in order. Of an expert group (replicas > 0: the ranks of its communicator)
/// the names are left out: they differ between sets of experts (expert_placement.hpp checks them).
class tensors_summary {
 public:
  tensors_summary(std::string label, std::size_t replicas) : label_(std::move(label)), replicas_(replicas) {}

  MPOPT_DECL void add(const std::string& name, std::size_t size, const tensor_shape& shape);

  MPOPT_DECL void settle(std::vector<setting>& all) const;

 private:
  std::string label_, text_;
  std::size_t replicas_, elements_ = 0, tensors_ = 0;
};

/// A group's options and tensors (`tensors`: all of them added).
MPOPT_DECL void add_group_settings(std::vector<setting>& all, const std::string& label,
                                   std::span<const field_ref> options, const tensors_summary& tensors);

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "same_settings.ipp"
#endif
