// mpopt — the tensor registry: parameter groups, the names and memory of their tensors, and the
// checks that keep any two tensors apart. The optimizer derives from it; finalize() fixes the
// groups, and the step pipeline lays their tensors out (step_pipeline.hpp, flat_layout.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../communicator.hpp"
#include "../../loss_scale.hpp"
#include "../../precision.hpp"
#include "../../rule.hpp"
#include "../../tensor.hpp"
#include "../../tensor_spec.hpp"
#include "../backend/aligned_buffer.hpp"
#include "../config.hpp"
#include "../passes/step_data.hpp"
#include "../backend/tensor_side.hpp"
#include "../options/field_refs.hpp"
#include "memory_listing.hpp"
#include "../options/validate.hpp"

namespace mpopt::detail {

template <class Pipeline>
class checkpointing;
template <class Precision, class LossScaler, class Partition, class UpdateRule, class Backend, class Communicator>
class step_pipeline;

/// Whether E has the bits of S; true where E has no numeric_traits at all, which add() reports on
/// its own (once, not once per check).
template <class E, class S>
struct stores_or_unknown : std::true_type {};
template <has_numeric_traits E, class S>
struct stores_or_unknown<E, S> : std::is_same<storage_t<E>, S> {};

/// A shape as messages write it: [2, 3].
MPOPT_DECL std::string shape_text(const tensor_shape& shape);

/// Refuses a shape with a negative dimension or whose product is not the element count.
MPOPT_DECL void check_shape(const std::string& name, const tensor_shape& shape, std::size_t size);

/// The optimizer derives from tensor_registry. Its code depends on the element types, the rule's
/// options and the backend, not on the rest of the optimizer's type: optimizers that share those
/// share it.
template <class Precision, class UpdateRule, class Backend>
class tensor_registry {
 public:
  using param_type = typename Precision::param_type;
  using grad_type = typename Precision::grad_type;
  using group_options = typename UpdateRule::options;

 private:
  /// Flat groups' tensors live where the backend wants the model's (tensor_side.hpp).
  template <class T>
  using buffer = tensor_buffer_t<Backend, T>;
  static constexpr memory_space tensor_space = tensor_space_of<Backend>();

 public:
  /// A parameter group: tensors sharing hyperparameters and a step counter. Either the user owns the
  /// tensors (add) or the group owns them in one flat buffer (add_flat_group).
  class param_group {
   public:
    /// Registers a user-owned parameter and its gradient. Both must stay alive and in place. Their
    /// elements are the precision's param_type and grad_type, or types with their bits
    /// (numeric_traits: Eigen::half for mpopt::half, say), read and written as those. `shape`, if
    /// given, is what checkpoints store for it, and a matrix rule's matrix (its product must be the
    /// element count).
    template <tensor P, tensor G>
    void add(P&& param, G&& grad, std::string name = {}, tensor_shape shape = {}) {
      using pe = tensor_element_t<P>;
      using ge = tensor_element_t<G>;
      constexpr bool known = has_numeric_traits<pe> && has_numeric_traits<ge>;
      static_assert(known, "tensor elements must be float, mpopt::half, mpopt::bfloat16, or a type mpopt::numeric_traits "
                           "maps to one (include <mpopt/interop.hpp> after Eigen's or CUDA's headers for theirs)");
      static_assert(stores_or_unknown<pe, param_type>::value,
                    "parameter tensor must hold the precision's param_type (float, mpopt::half or mpopt::bfloat16) "
                    "or a type with its bits (mpopt::numeric_traits<element>::storage)");
      static_assert(stores_or_unknown<ge, grad_type>::value,
                    "gradient tensor must hold the precision's grad_type (float, mpopt::half or mpopt::bfloat16) "
                    "or a type with its bits (mpopt::numeric_traits<element>::storage)");
      // Only the messages above, not the errors a wrong type would cause below.
      if constexpr (known && stores_or_unknown<pe, param_type>::value && stores_or_unknown<ge, grad_type>::value)
        add_views(storage_view(param), storage_view(grad), std::move(name), std::move(shape));
    }

    /// Registers a parameter and its gradient held as raw buffers of n elements each (an engine's
    /// views into one flat allocation, say), in the memory the backend reads the model's tensors from.
    template <class PE, class GE>
    void add(PE* param, GE* grad, std::size_t n, std::string name = {}, tensor_shape shape = {}) {
      add(view<PE>{param, n, tensor_space}, view<GE>{grad, n, tensor_space}, std::move(name), std::move(shape));
    }
    /// Registers a parameter held as a raw buffer of n elements, its gradient held by the optimizer:
    /// returns that gradient (zeros, in the memory of the model's tensors) for the backward pass to
    /// write; grad(i) hands it out again. For engines that own their weights but not their gradients.
    template <class PE>
    std::span<grad_type> add(PE* param, std::size_t n, std::string name = {}, tensor_shape shape = {}) {
      name = next_name(std::move(name));
      owner_->check_new_tensor(name, n, n, tensor_space, tensor_space);  // before allocating n elements
      held_grads_.reserve(held_grads_.size() + 1);  // so that nothing can fail once it is registered
      auto grad = buffer<grad_type>::zeroed(n);
      add(view<PE>{param, n, tensor_space}, view<grad_type>{grad.data(), n, tensor_space}, std::move(name),
          std::move(shape));
      held_grads_.push_back(std::move(grad));
      return {held_grads_.back().data(), n};
    }
    template <class P, class G>
      requires detail::raw_pointer_pair<P, G>
    void add(P&&, G&&, std::string = {}, tensor_shape = {}) {
      detail::refuse_raw_pointer<P, G>();
    }

    /// The name add() gives the next tensor: `name`, or if it is empty the group's next ("group 1.3").
    /// Throws mpopt::error on a flat group, whose tensors add_flat_group fixed.
    MPOPT_COLD std::string next_name(std::string name) const {
      if (flat_) fail(label_, " is a flat group: its tensors are fixed by add_flat_group");
      if (name.empty()) name = label_ + "." + std::to_string(entries_.size());
      return name;
    }

    std::size_t size() const { return entries_.size(); }
    std::span<param_type> param(std::size_t i) { return {at(i).param, at(i).size}; }
    std::span<grad_type> grad(std::size_t i) { return {at(i).grad, at(i).size}; }
    const std::string& name(std::size_t i) const { return at(i).name; }
    /// The shape tensor i was registered with; empty if none was given.
    const tensor_shape& shape(std::size_t i) const { return at(i).shape; }

    const group_options& options() const { return options_; }
    /// Its options; with a schedule (optimizer::set_schedule), their `lr` is its base rate.
    void set_options(const group_options& o) {
      check_options(o, label_);
      options_ = o;
      base_lr_ = group_rate(o);
    }
    /// The rate of its last step (the schedule's, where there is one) or, before any, the next.
    double lr() const { return group_rate(options_); }
    /// The rate it was given, which a schedule scales (lr_schedule.hpp).
    double base_lr() const { return base_lr_; }
    void set_lr(double lr) {
      group_options o = options_;
      group_rate(o) = lr;
      set_options(o);
    }
    /// Applied steps of this group (the t of bias correction is step() + 1 on the next update).
    std::uint64_t step() const { return step_; }
    /// Whether the group holds experts, data-parallel over a communicator of their own
    /// (optimizer::add_expert_group).
    bool expert_parallel() const { return comm_ != 0; }

   private:
    friend class tensor_registry;
    // The step and the checkpoints read and restore the groups.
    template <class, class, class, class, class, class>
    friend class step_pipeline;
    template <class>
    friend class checkpointing;
    struct entry {
      std::string name;
      param_type* param;
      grad_type* grad;
      std::size_t size;
      tensor_shape shape;  ///< as registered; empty: none given
    };

    MPOPT_COLD void add_views(view<param_type> p, view<grad_type> g, std::string name, tensor_shape shape) {
      name = next_name(std::move(name));
      owner_->check_new_tensor(name, p.size, g.size, p.space, g.space);
      if (p.data == nullptr || g.data == nullptr) fail("tensor '", name, "' has a null data pointer");
      check_shape(name, shape, p.size);
      owner_->check_unclaimed(name, p.data, g.data, p.size);
      entries_.push_back({std::move(name), p.data, g.data, p.size, std::move(shape)});
      owner_->claim(index_, entries_.size() - 1);
    }

    param_group(tensor_registry* owner, std::uint32_t index, const group_options& o)
        : owner_(owner), index_(index), label_("group " + std::to_string(index)) {
      set_options(o);
    }
    const entry& at(std::size_t i) const {
      if (i >= entries_.size()) fail(label_, " has ", entries_.size(), " tensors, no tensor ", i);
      return entries_[i];
    }

    tensor_registry* owner_;
    std::uint32_t index_;
    std::string label_;
    group_options options_;
    double base_lr_ = 0;  ///< the rate the user gave: a schedule's base; options_.lr is the step's
    std::vector<entry> entries_;
    std::uint64_t step_ = 0;
    std::uint32_t comm_ = 0;  ///< its data-parallel communicator: 0 the optimizer's, k its k-th expert one
    bool flat_ = false;
    buffer<param_type> flat_param_;
    buffer<grad_type> flat_grad_;
    std::vector<buffer<grad_type>> held_grads_;  ///< the gradients of tensors added as (param, n)
  };

  /// A group of user-owned tensors; register them with param_group::add.
  param_group& add_group(const group_options& o) { return new_group(o); }

  /// A group whose parameters and gradients live in two flat buffers the optimizer owns (the fused
  /// layout): param(i) and grad(i) are views to hand to the model. Parameters start at zero.
  MPOPT_COLD param_group& add_flat_group(const group_options& o, std::span<const tensor_spec> tensors) {
    const std::string label = "group " + std::to_string(groups_.size());
    std::vector<std::string> names;
    std::set<std::string, std::less<>> group_names;
    std::vector<std::size_t> offsets;
    std::size_t total = 0;
    for (const auto& t : tensors) {
      names.push_back(t.name.empty() ? label + "." + std::to_string(names.size()) : t.name);
      check_new_tensor(names.back(), t.size, t.size, tensor_space, tensor_space);
      check_shape(names.back(), t.shape, t.size);
      if (!group_names.insert(names.back()).second) fail("tensor name '", names.back(), "' is used twice");
      offsets.push_back(total);
      total = align_up(total + t.size);
    }
    auto params = buffer<param_type>::zeroed(total);
    auto grads = buffer<grad_type>::zeroed(total);
    for (std::size_t i = 0; i < tensors.size(); ++i)  // new memory, unless a registered tensor was freed
      check_unclaimed(names[i], params.data() + offsets[i], grads.data() + offsets[i], tensors[i].size);
    param_group& g = new_group(o);
    g.flat_ = true;
    g.flat_param_ = std::move(params);
    g.flat_grad_ = std::move(grads);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      g.entries_.push_back({std::move(names[i]), g.flat_param_.data() + offsets[i], g.flat_grad_.data() + offsets[i],
                            tensors[i].size, tensors[i].shape});
      claim(g.index_, i);
    }
    return g;
  }
  param_group& add_flat_group(const group_options& o, std::initializer_list<tensor_spec> tensors) {
    return add_flat_group(o, std::span<const tensor_spec>(tensors.begin(), tensors.size()));
  }

  std::size_t group_count() const { return groups_.size(); }
  param_group& group(std::size_t i) {
    if (i >= groups_.size()) fail("there are ", groups_.size(), " groups, no group ", i);
    return *groups_[i];
  }

 protected:
  template <class, class, class, class, class, class>
  friend class step_pipeline;  // the step reads the groups, and finalize() fixes them

  tensor_registry() = default;
  tensor_registry(const tensor_registry&) = delete;
  tensor_registry& operator=(const tensor_registry&) = delete;

  static std::size_t align_up(std::size_t n) {
    constexpr std::size_t a = aligned_buffer<float>::alignment / sizeof(float);
    return (n + a - 1) / a * a;
  }

  MPOPT_COLD param_group& new_group(const group_options& o) {
    if (finalized_) fail("cannot add a group after the first step");
    groups_.push_back(std::unique_ptr<param_group>(new param_group(this, std::uint32_t(groups_.size()), o)));
    return *groups_.back();
  }

  MPOPT_COLD void check_new_tensor(const std::string& name, std::size_t param_size, std::size_t grad_size,
                                   memory_space param_space, memory_space grad_space) const {
    if (finalized_) fail("cannot add tensor '", name, "' after the first step");
    if (param_size != grad_size)
      fail("tensor '", name, "': parameter has ", param_size, " elements but gradient has ", grad_size);
    if (param_size == 0) fail("tensor '", name, "' has no elements");
    if (param_size > std::size_t(PTRDIFF_MAX) / sizeof(float))  // its fp32 state could not be addressed
      fail("tensor '", name, "' has ", param_size, " elements: more than memory can hold");
    auto where = [](memory_space s) { return s == memory_space::host ? "host" : "device"; };
    if (!Backend::accepts(param_space) || !Backend::accepts(grad_space))
      fail("tensor '", name, "': parameter in ", where(param_space), " memory, gradient in ", where(grad_space),
                   " memory; the ", Backend::name, " backend needs ", where(tensor_space), " memory");
    if (names_.contains(name)) fail("tensor name '", name, "' is used twice");
  }

  /// Refuses tensor `name` if its parameter and gradient overlap each other or any tensor registered
  /// before: the update would read one tensor's writes as another's input. Each check looks at the
  /// two neighbours in an address-ordered map: O(n log n) for n tensors.
  MPOPT_COLD void check_unclaimed(const std::string& name, const param_type* param, const grad_type* grad,
                                  std::size_t size) const {
    const auto [p, p_end] = bytes_of(param, size);
    const auto [g, g_end] = bytes_of(grad, size);
    if (std::less<>{}(p, g_end) && std::less<>{}(g, p_end))
      fail("tensor '", name, "': parameter and gradient memory overlap");
    auto refuse_overlap = [&](const std::byte* begin, const std::byte* end, std::string_view what) {
      const auto next = claimed_.upper_bound(begin);  // the first range starting after begin
      const claimed_memory* other = nullptr;
      if (next != claimed_.end() && std::less<>{}(next->first, end)) other = &next->second;
      else if (next != claimed_.begin() && std::less<>{}(begin, std::prev(next)->second.end)) other = &std::prev(next)->second;
      if (other)
        fail("tensor '", name, "': its ", what, " memory overlaps the ", other->gradient ? "gradient" : "parameter",
                     " of tensor '", groups_[other->group]->entries_[other->entry].name,
                     "'; every tensor needs memory of its own");
    };
    refuse_overlap(p, p_end, "parameter");
    refuse_overlap(g, g_end, "gradient");
  }
  /// Records the name and memory of entry i of group g, checked by check_new_tensor and
  /// check_unclaimed.
  MPOPT_COLD void claim(std::uint32_t group, std::size_t i) {
    const auto& e = groups_[group]->entries_[i];
    names_.insert(e.name);
    const auto [p, p_end] = bytes_of(e.param, e.size);
    const auto [g, g_end] = bytes_of(e.grad, e.size);
    claimed_.emplace(p, claimed_memory{p_end, group, std::uint32_t(i), false});
    claimed_.emplace(g, claimed_memory{g_end, group, std::uint32_t(i), true});
  }
  template <class T>
  static std::pair<const std::byte*, const std::byte*> bytes_of(const T* data, std::size_t size) {
    const auto* begin = reinterpret_cast<const std::byte*>(data);
    return {begin, begin + size * sizeof(T)};
  }

  /// The name of tensor i, counting every group's tensors in order.
  MPOPT_COLD const std::string& tensor_name(std::size_t i) const {
    for (const auto& g : groups_) {
      if (i < g->entries_.size()) return g->entries_[i].name;
      i -= g->entries_.size();
    }
    fail("no tensor ", i);
  }
  std::size_t first_tensor_of(std::uint32_t g) const {
    std::size_t n = 0;
    for (std::uint32_t k = 0; k < g; ++k) n += groups_[k]->entries_.size();
    return n;
  }

  /// Every tensor's slot in the step's table, in registration order (the same on every rank and
  /// layout): its memory, group and first element in the flat order of all tensors.
  MPOPT_COLD std::vector<tensor_slot<param_type, grad_type>> tensor_table() const {
    std::vector<tensor_slot<param_type, grad_type>> table;
    std::uint64_t first = 0;
    for (std::uint32_t gi = 0; gi < groups_.size(); ++gi)
      for (const auto& e : groups_[gi]->entries_) {
        table.push_back({e.param, e.grad, e.size, gi, first});
        first += e.size;
      }
    return table;
  }

  /// The model's tensors in the memory report: a flat group's buffers and the gradients it holds as
  /// the optimizer's, the user's tensors as theirs.
  void list_tensors(mpopt::memory_report& r) const {
    constexpr std::size_t param_bytes = sizeof(param_type), grad_bytes = sizeof(grad_type);
    std::size_t user_params = 0, user_grads = 0;
    for (const auto& g : groups_) {
      if (g->flat_) {
        list_flat_group(r, g->label_, g->flat_param_.size() * param_bytes, g->flat_grad_.size() * grad_bytes);
        continue;
      }
      std::size_t elements = 0, held = 0;
      for (const auto& e : g->entries_) elements += e.size;
      for (const auto& b : g->held_grads_) held += b.size();
      if (held) list_held_gradients(r, g->label_, held * grad_bytes);
      user_params += elements;
      user_grads += elements - held;
    }
    list_user_tensors(r, user_params * param_bytes, user_grads * grad_bytes);
  }

  std::vector<std::unique_ptr<param_group>> groups_;
  bool finalized_ = false;  ///< the groups are fixed (optimizer::finalize)

 private:
  /// The memory of every registered tensor, by start address (check_unclaimed). Made at
  /// registration, like the groups' entries, and so not in memory_report().
  struct claimed_memory {
    const std::byte* end;
    std::uint32_t group, entry;
    bool gradient;
  };
  std::map<const std::byte*, claimed_memory, std::less<>> claimed_;
  std::set<std::string, std::less<>> names_;  ///< every registered tensor's: a look-up, not a scan, per add
};

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "tensor_registry.ipp"
#endif
