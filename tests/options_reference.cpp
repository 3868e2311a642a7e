// The options reference (docs/options.md) from the options tables themselves (fields.hpp): each
// options struct's fields with their defaults (a default-made struct's values), their valid values
// (the fields' checks) and the DeepSpeed key the configuration reader reads into them.
//
//   options_reference                  prints the tables
//   options_reference --check PAGE     exits 1 unless every table of PAGE is the one printed (test
//                                      'options_reference'), naming the first that differs
//   options_reference --write PAGE     puts the printed tables into PAGE, between their markers
//
// In the page each table sits between "<!-- options: NAME -->" and "<!-- end options -->"; the
// prose around them is the page's own.
#include <mpopt/mpopt.hpp>
#include <mpopt/muon_options.hpp>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using mpopt::detail::field_kind;
using mpopt::detail::field_ref;

/// The update rules' options: DeepSpeed reads each field under optimizer.params by its name, except
/// these.
const std::map<std::string, std::string, std::less<>> rule_keys_by_hand = {
    {"beta1", "`optimizer.params.betas[0]`"},
    {"beta2", "`optimizer.params.betas[1]`"},
    {"decoupled_weight_decay", "`optimizer.type` AdamW, or `optimizer.params.adam_w_mode`"},
    {"freeze_step", "`optimizer.params.freeze_step`, minus one"},
    {"compression.scale", "`optimizer.params.compression_scale`"},
    {"compression.exclude_zero_variance", "`optimizer.params.exclude_zero_variance`"},
    {"compression.zero_variance_ratio", "`optimizer.params.zero_variance_ratio`"}};

/// The other structs' DeepSpeed keys (as the page writes them), by struct and field.
const std::map<std::string, std::map<std::string, std::string>, std::less<>> deepspeed_keys = {
    {"optimizer_options",
     {{"clip_grad", "`gradient_clipping`"},
      {"accumulation_steps", "`gradient_accumulation_steps`, or `train_batch_size` / (micro-batch x ranks)"},
      {"skip_nonfinite", "`bf16.check_grad_overflow` (fp16: always on)"},
      {"bucket_elements", "`zero_optimization.reduce_bucket_size`"},
      {"gradient_predivide", "`gradient_predivide_factor`"},
      {"overlap_comm", "`zero_optimization.overlap_comm`"}}},
    {"static_scale_options", {{"scale", "`fp16.loss_scale` above 0"}}},
    {"dynamic_scale_options",
     {{"init_scale", "2^`fp16.initial_scale_power`"},
      {"window", "`fp16.loss_scale_window`"},
      {"min_scale", "`fp16.min_loss_scale`"},
      {"hysteresis", "`fp16.hysteresis`"},
      {"consecutive_hysteresis", "`fp16.consecutive_hysteresis`"}}},
};

/// The key DeepSpeed reads into `field` of struct `name` ("" where none); `rule`: an update
/// rule's options.
std::string deepspeed_key(const std::string& name, const std::string& field, bool rule) {
  if (rule) {
    const auto k = rule_keys_by_hand.find(field);
    return k != rule_keys_by_hand.end() ? k->second : "`optimizer.params." + field + "`";
  }
  const auto found = deepspeed_keys.find(name);
  if (found == deepspeed_keys.end()) return "";
  const auto k = found->second.find(field);
  return k != found->second.end() ? k->second : "";
}

/// A bound as the page writes it: 2^k for powers of two past 1024, FLT_MAX by name.
std::string bound_text(double x) {
  if (x == double(FLT_MAX)) return "FLT_MAX";
  if (x == double(FLT_MIN)) return "FLT_MIN";
  if (x == 1 / double(FLT_MIN)) return "1/FLT_MIN";
  int e = 0;
  if (x > 1024 && std::frexp(x, &e) == 0.5) return "2^" + std::to_string(e - 1);
  return mpopt::detail::shortest_text(x);
}

/// What a field may hold: its type's values, narrowed by its check.
std::string valid_values(const field_ref& f) {
  switch (f.kind) {
    case field_kind::flag: return "true, false";
    case field_kind::choice: {
      std::string s;
      for (std::string_view c : f.choices) s += (s.empty() ? "" : ", ") + std::string(c);
      return s;
    }
    case field_kind::group: return "";
    case field_kind::number:
    case field_kind::integer: break;
  }
  const mpopt::check& c = *f.rule;
  std::string s;
  const bool low = std::isfinite(c.lo), high = std::isfinite(c.hi);
  if (low && high) s = std::string(c.lo_open ? "(" : "[") + bound_text(c.lo) + ", " + bound_text(c.hi) + (c.hi_open ? ")" : "]");
  else if (low) s = std::string(c.lo_open ? "> " : ">= ") + bound_text(c.lo);
  else if (high) s = std::string(c.hi_open ? "< " : "<= ") + bound_text(c.hi);
  if (f.kind == field_kind::integer) s = (s.empty() ? "" : s + ", ") + "an integer";
  else if (s.empty()) s = "any finite number";
  if (c.as_float) s += ", finite as a float";
  if (!c.why.empty()) s += " (" + std::string(c.why) + ")";
  return s;
}

/// One struct's table: a row per field, a nested struct's fields under its name. `rule`: an update
/// rule's options.
template <class O>
std::string table(const std::string& name, bool rule = false) {
  const O defaults{};
  std::string out = "| field | default | valid values | DeepSpeed key |\n|---|---|---|---|\n";
  const auto rows = [&](const auto& self, const std::vector<field_ref>& fields, const std::string& prefix) -> void {
    for (const field_ref& f : fields) {
      const std::string field = prefix + std::string(f.name);
      if (f.kind == field_kind::group) {
        self(self, f.members(f.at), field + ".");
        continue;
      }
      out += "| `" + field + "` | " + mpopt::detail::field_text(f) + " | " + valid_values(f) + " | " +
             deepspeed_key(name, field, rule) + " |\n";
    }
  };
  rows(rows, mpopt::detail::field_refs(defaults), "");
  if (const auto found = deepspeed_keys.find(name); found != deepspeed_keys.end())
    for (const auto& [field, key] : found->second)  // a key for a field the struct no longer has
      if (out.find("| `" + field + "` |") == std::string::npos)
        throw std::runtime_error(name + " has no field " + field + ", which deepspeed_keys names");
  return out;
}

/// Every table, by name, in the page's order.
std::vector<std::pair<std::string, std::string>> tables() {
  return {{"adam::options", table<mpopt::adam::options>("adam::options", true)},
          {"lamb::options", table<mpopt::lamb::options>("lamb::options", true)},
          {"onebit_lamb_options", table<mpopt::onebit_lamb_options>("onebit_lamb_options", true)},
          {"onebit_adam_options", table<mpopt::onebit_adam_options>("onebit_adam_options", true)},
          {"zero_one_adam_options", table<mpopt::zero_one_adam_options>("zero_one_adam_options", true)},
          {"muon_options", table<mpopt::muon_options>("muon_options")},
          {"optimizer_options", table<mpopt::optimizer_options>("optimizer_options")},
          {"static_scale_options", table<mpopt::static_scale_options>("static_scale_options")},
          {"dynamic_scale_options", table<mpopt::dynamic_scale_options>("dynamic_scale_options")}};
}

constexpr std::string_view end_marker = "<!-- end options -->";

std::string marker(const std::string& name) { return "<!-- options: " + name + " -->"; }

/// PAGE with every table put between its markers; `missing` gets the names without them.
std::string with_tables(std::string page, std::vector<std::string>& missing) {
  for (const auto& [name, text] : tables()) {
    const std::size_t open = page.find(marker(name));
    const std::size_t close = open == std::string::npos ? open : page.find(end_marker, open);
    if (close == std::string::npos) {
      missing.push_back(name);
      continue;
    }
    const std::size_t from = open + marker(name).size();
    page.replace(from, close - from, "\n" + text);
  }
  return page;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode.empty()) {
    for (const auto& [name, text] : tables()) std::printf("%s\n%s%s\n\n", marker(name).c_str(), text.c_str(), end_marker.data());
    return 0;
  }
  if ((mode != "--check" && mode != "--write") || argc != 3) {
    std::fprintf(stderr, "usage: options_reference [--check PAGE | --write PAGE]\n");
    return 2;
  }
  std::ifstream in(argv[2]);
  if (!in) {
    std::fprintf(stderr, "options_reference: cannot read %s\n", argv[2]);
    return 1;
  }
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> missing;
  const std::string expected = with_tables(page, missing);
  for (const std::string& name : missing) std::fprintf(stderr, "options_reference: %s has no table for %s\n", argv[2], name.c_str());
  if (mode == "--write") {
    std::ofstream(argv[2]) << expected;
    return missing.empty() ? 0 : 1;
  }
  if (expected == page && missing.empty()) {
    std::printf("%s: every options table is the library's\n", argv[2]);
    return 0;
  }
  for (const auto& [name, text] : tables())
    if (page.find(marker(name) + "\n" + text) == std::string::npos)
      std::fprintf(stderr, "options_reference: %s: the table of %s differs from the library's (run "
                           "options_reference --write %s)\n", argv[2], name.c_str(), argv[2]);
  return 1;
}
