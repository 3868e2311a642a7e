// mpopt — a type-erased optimizer: one class for every combination of policies chosen at run time
// (make_optimizer.hpp builds it from a DeepSpeed configuration). Code that trains through it
// includes only this header, which instantiates no optimizer: the one translation unit that
// includes make_optimizer.hpp pays for the combinations.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "detail/options/validate.hpp"
#include "lr_schedule.hpp"
#include "memory_report.hpp"
#include "numeric.hpp"
#include "options.hpp"
#include "status.hpp"
#include "tensor.hpp"
#include "tensor_spec.hpp"

namespace mpopt {

/// The element types a tensor can hold, at run time.
enum class element_type : std::uint8_t { fp32, fp16, bf16 };

constexpr std::string_view to_string(element_type t) {
  switch (t) {
    case element_type::fp32: return "fp32";
    case element_type::fp16: return "fp16";
    case element_type::bf16: return "bf16";
  }
  return "?";
}

/// The element_type of T: float, mpopt::half, mpopt::bfloat16, or a type with the bits of one
/// (mpopt::numeric_traits: Eigen::half, __half, ...).
template <class T>
inline constexpr element_type element_type_of = [] {
  if constexpr (!detail::has_numeric_traits<T>) {
    static_assert(detail::has_numeric_traits<T>, "tensor elements must be float, mpopt::half, mpopt::bfloat16, or "
                                                 "a type mpopt::numeric_traits maps to one (include "
                                                 "<mpopt/interop.hpp> after Eigen's or CUDA's headers for theirs)");
    return element_type::fp32;
  } else if constexpr (std::is_same_v<storage_t<T>, float>) {
    return element_type::fp32;
  } else if constexpr (std::is_same_v<storage_t<T>, half>) {
    return element_type::fp16;
  } else {
    return element_type::bf16;
  }
}();

/// A parameter group's options where they differ from the configuration's (unset: the
/// configuration's value). Adam and LAMB have all five; a field the group's rule lacks is refused.
struct group_settings {
  std::optional<double> lr = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
  std::optional<double> beta1 = std::nullopt;
  std::optional<double> beta2 = std::nullopt;
  std::optional<double> eps = std::nullopt;
  /// Under a set of rules (mpopt::rules, rules.hpp), the one the group takes, by name ("muon");
  /// unset: the set's first. Otherwise, if given, the optimizer's rule.
  std::optional<std::string> rule = std::nullopt;
};

namespace detail {

/// A tensor seen through no type: where its elements are, how many, of which type.
struct erased_tensor {
  void* data = nullptr;
  std::size_t size = 0;
  element_type type = element_type::fp32;
  memory_space space = memory_space::host;
};

template <class E>
erased_tensor erase(const view<E>& v) {
  return {static_cast<void*>(v.data), v.size, element_type_of<E>, v.space};
}

/// What any_optimizer asks of the optimizer it holds; make_optimizer.hpp implements it for each
/// mpopt::optimizer it instantiates. Groups and tensors are addressed by index.
class optimizer_interface {
 public:
  virtual ~optimizer_interface() = default;

  virtual std::size_t add_group(const group_settings& s) = 0;
  virtual std::size_t add_flat_group(const group_settings& s, std::span<const tensor_spec> tensors) = 0;
  /// Checks both element types against the precision's before anything is registered.
  virtual void add(std::size_t group, erased_tensor param, erased_tensor grad, std::string name,
                   tensor_shape shape) = 0;
  /// Registers a parameter whose gradient the optimizer holds; returns that gradient.
  virtual erased_tensor add(std::size_t group, erased_tensor param, std::string name, tensor_shape shape) = 0;
  virtual std::size_t group_count() const = 0;
  virtual std::size_t group_size(std::size_t group) const = 0;
  virtual const std::string& tensor_name(std::size_t group, std::size_t i) const = 0;
  virtual erased_tensor param(std::size_t group, std::size_t i) = 0;
  virtual erased_tensor grad(std::size_t group, std::size_t i) = 0;
  virtual double lr(std::size_t group) const = 0;
  virtual void set_lr(std::size_t group, double lr) = 0;
  virtual std::uint64_t group_step(std::size_t group) const = 0;

  virtual void finalize() = 0;
  virtual void grad_ready(std::size_t i) = 0;
  virtual bool grad_consumed(std::size_t i) const = 0;
  virtual step_status step() = 0;
  virtual step_status step(double loss) = 0;
  virtual void finish_step() = 0;
  virtual void wait_params(std::size_t i) = 0;
  virtual void zero_grad() = 0;

  virtual void set_schedule(const lr_schedule& s) = 0;
  virtual void clear_schedule() = 0;
  virtual const std::optional<lr_schedule>& schedule() const = 0;

  virtual double loss_scale() const = 0;
  virtual const optimizer_options& config() const = 0;
  virtual std::string policies() const = 0;
  virtual element_type param_type() const = 0;
  virtual element_type grad_type() const = 0;
  virtual std::size_t tensor_count() const = 0;
  virtual std::span<const float> master(std::size_t i) const = 0;
  virtual owned_elements owned(std::size_t i) const = 0;
  virtual mpopt::memory_report memory_report() const = 0;
  virtual void save(const std::filesystem::path& path) = 0;
  virtual void save(std::vector<std::byte>& bytes) = 0;
  virtual void save(std::ostream& out) = 0;
  virtual void load(const std::filesystem::path& path, load_options o) = 0;
  virtual void load(std::span<const std::byte> bytes, load_options o) = 0;
  virtual void load(std::istream& in, load_options o) = 0;

  /// The optimizer itself if its type is `t`, else null.
  virtual void* target(const std::type_info& t) = 0;
};

}  // namespace detail

/// An optimizer whose policies were chosen at run time (make_optimizer). The interface is the
/// typed optimizer's: groups, tensors of any type tensor_traits adapts, step(), loss_scale(),
/// save() and load(); a tensor whose element type is not the precision's is an mpopt::error naming
/// it and both types. target<Opt>() hands out the typed optimizer for anything more.
class any_optimizer {
 public:
  /// A handle to one parameter group (cheap to copy; valid as long as the optimizer).
  class param_group {
   public:
    /// Registers a user-owned parameter and its gradient, as optimizer::param_group::add does:
    /// elements of the precision's type or of a type with its bits; `shape` for checkpoints.
    template <tensor P, tensor G>
    param_group& add(P&& param, G&& grad, std::string name = {}, tensor_shape shape = {}) {
      constexpr bool known =
          detail::has_numeric_traits<tensor_element_t<P>> && detail::has_numeric_traits<tensor_element_t<G>>;
      static_assert(known, "tensor elements must be float, mpopt::half, mpopt::bfloat16, or a type "
                           "mpopt::numeric_traits maps to one (include <mpopt/interop.hpp> after Eigen's or CUDA's "
                           "headers for theirs)");
      if constexpr (known)  // only the message above, not the errors an unknown type would cause below
        impl_->add(index_, detail::erase(detail::storage_view(param)), detail::erase(detail::storage_view(grad)),
                   std::move(name), std::move(shape));
      return *this;
    }
    /// A parameter and its gradient held as raw host buffers of n elements each.
    template <class PE, class GE>
    param_group& add(PE* param, GE* grad, std::size_t n, std::string name = {}, tensor_shape shape = {}) {
      return add(view<PE>{param, n}, view<GE>{grad, n}, std::move(name), std::move(shape));
    }
    /// A parameter held as a raw host buffer of n elements, its gradient held by the optimizer, as
    /// optimizer::param_group::add(param, n) does: returns that gradient as elements of G (by
    /// default the parameter's type), as grad<G>(i) would.
    template <class G = void, class PE, class GE = std::conditional_t<std::is_void_v<G>, PE, G>>
    std::span<GE> add(PE* param, std::size_t n, std::string name = {}, tensor_shape shape = {}) {
      constexpr bool known = detail::has_numeric_traits<PE> && detail::has_numeric_traits<GE>;
      static_assert(known, "tensor elements must be float, mpopt::half, mpopt::bfloat16, or a type "
                           "mpopt::numeric_traits maps to one (include <mpopt/interop.hpp> after Eigen's or CUDA's "
                           "headers for theirs)");
      if constexpr (known) {
        if (element_type_of<GE> != impl_->grad_type())  // before anything is registered
          detail::fail("add(param, n): the optimizer's gradients hold ", to_string(impl_->grad_type()), ", not ",
                       to_string(element_type_of<GE>), " (add<G>(param, n) names the type to hand them out as)");
        const auto grad = impl_->add(index_, detail::erase(detail::storage_view(view<PE>{param, n})),
                                     std::move(name), std::move(shape));
        return {reinterpret_cast<GE*>(static_cast<storage_t<GE>*>(grad.data)), grad.size};
      }
      return {};
    }
    template <class P, class G>
      requires detail::raw_pointer_pair<P, G>
    param_group& add(P&&, G&&, std::string = {}, tensor_shape = {}) {
      detail::refuse_raw_pointer<P, G>();
      return *this;
    }
    std::size_t size() const { return impl_->group_size(index_); }
    const std::string& name(std::size_t i) const { return impl_->tensor_name(index_, i); }
    /// Tensor i's parameter (gradient) as elements of T: the precision's type, or one with its bits.
    template <class T>
    std::span<T> param(std::size_t i) {
      return typed<T>(impl_->param(index_, i), "parameter", i);
    }
    template <class T>
    std::span<T> grad(std::size_t i) {
      return typed<T>(impl_->grad(index_, i), "gradient", i);
    }
    double lr() const { return impl_->lr(index_); }
    void set_lr(double lr) { impl_->set_lr(index_, lr); }
    /// Applied steps of this group.
    std::uint64_t step() const { return impl_->group_step(index_); }
    std::size_t index() const { return index_; }

   private:
    friend class any_optimizer;
    param_group(detail::optimizer_interface* impl, std::size_t index) : impl_(impl), index_(index) {}
    template <class T>
    std::span<T> typed(detail::erased_tensor t, std::string_view what, std::size_t i) const {
      if (t.type != element_type_of<T>)
        detail::fail("tensor '", name(i), "': its ", what, " holds ", to_string(t.type), ", not ",
                     to_string(element_type_of<T>));
      return {reinterpret_cast<T*>(static_cast<storage_t<T>*>(t.data)), t.size};  // storage_t checked the layout
    }

    detail::optimizer_interface* impl_;
    std::size_t index_;
  };

  explicit any_optimizer(std::unique_ptr<detail::optimizer_interface> impl) : impl_(std::move(impl)) {
    if (!impl_) detail::fail("any_optimizer: no optimizer to hold");
  }

  /// A group of user-owned tensors, with the configuration's options except where `s` says.
  param_group add_group(const group_settings& s = {}) { return {impl_.get(), impl_->add_group(s)}; }
  /// A group whose tensors live in two flat buffers the optimizer owns (param<T>(i), grad<T>(i)).
  param_group add_flat_group(const group_settings& s, std::span<const tensor_spec> tensors) {
    return {impl_.get(), impl_->add_flat_group(s, tensors)};
  }
  param_group add_flat_group(const group_settings& s, std::initializer_list<tensor_spec> tensors) {
    return add_flat_group(s, std::span<const tensor_spec>(tensors.begin(), tensors.size()));
  }
  std::size_t group_count() const { return impl_->group_count(); }
  param_group group(std::size_t i) {
    if (i >= group_count()) detail::fail("there are ", group_count(), " groups, no group ", i);
    return {impl_.get(), i};
  }

  void finalize() { impl_->finalize(); }
  void grad_ready(std::size_t i) { impl_->grad_ready(i); }
  bool grad_consumed(std::size_t i) const { return impl_->grad_consumed(i); }
  step_status step() { return impl_->step(); }
  step_status step(double loss) { return impl_->step(loss); }  ///< with the loss, for the spike guard
  void finish_step() { impl_->finish_step(); }
  /// optimizer::wait_params: under leave_param_gather_in_flight, the parameters' all-gather finished
  /// (i: tensor i's only).
  void wait_params(std::size_t i = std::size_t(-1)) { impl_->wait_params(i); }
  void zero_grad() { impl_->zero_grad(); }

  /// optimizer::set_schedule: every group's rate follows `s` from the next step on.
  void set_schedule(const lr_schedule& s) { impl_->set_schedule(s); }
  void clear_schedule() { impl_->clear_schedule(); }
  const std::optional<lr_schedule>& schedule() const { return impl_->schedule(); }

  /// The factor the loss must be multiplied by before backward.
  double loss_scale() const { return impl_->loss_scale(); }
  const optimizer_options& config() const { return impl_->config(); }
  /// The policies it runs, e.g. "fp16, dynamic_scale, zero2, adam, host, mpi".
  std::string policies() const { return impl_->policies(); }
  /// The element type its parameters and gradients must hold.
  element_type param_type() const { return impl_->param_type(); }
  element_type grad_type() const { return impl_->grad_type(); }
  std::size_t tensor_count() const { return impl_->tensor_count(); }
  /// fp32 master weights of tensor i (registration order), the elements this rank holds.
  std::span<const float> master(std::size_t i) const { return impl_->master(i); }
  /// optimizer::owned: which elements of tensor i master(i) holds on this rank.
  owned_elements owned(std::size_t i) const { return impl_->owned(i); }
  mpopt::memory_report memory_report() const { return impl_->memory_report(); }
  /// optimizer::save and load: to and from a path, a byte buffer or a stream.
  void save(const std::filesystem::path& path) { impl_->save(path); }
  void save(std::vector<std::byte>& bytes) { impl_->save(bytes); }
  void save(std::ostream& out) { impl_->save(out); }
  void load(const std::filesystem::path& path, load_options o = {}) { impl_->load(path, o); }
  void load(std::span<const std::byte> bytes, load_options o = {}) { impl_->load(bytes, o); }
  void load(std::istream& in, load_options o = {}) { impl_->load(in, o); }

  /// The typed optimizer if it is an Opt (mpopt::optimizer<...>), else null.
  template <class Opt>
  Opt* target() {
    return static_cast<Opt*>(impl_->target(typeid(Opt)));
  }
  template <class Opt>
  const Opt* target() const {
    return static_cast<const Opt*>(impl_->target(typeid(Opt)));
  }

 private:
  std::unique_ptr<detail::optimizer_interface> impl_;
};

}  // namespace mpopt
