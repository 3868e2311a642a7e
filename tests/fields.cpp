// Options as data (fields.hpp): from one table per options struct, the checks, the checkpoint
// record (JSON), the settings compared across ranks and the choices by name. Every kind of field,
// its extremes and each way a record can be wrong.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <mpopt/adam.hpp>
#include <mpopt/detail/options/fields_json.hpp>
#include <mpopt/detail/comm/same_settings.hpp>
#include <mpopt/fields.hpp>
#include <mpopt/lamb.hpp>
#include <mpopt/loss_scale.hpp>
#include <mpopt/onebit_adam_options.hpp>
#include <mpopt/onebit_lamb_options.hpp>
#include <mpopt/options.hpp>
#include <mpopt/zero_one_adam_options.hpp>

#include "error_of.hpp"

namespace {

const std::string no_error = "<no exception>";  // error_of's word for a call that returned

enum class shade : std::uint8_t { light, dark, dim };
constexpr std::array<std::string_view, 3> choice_names(shade) { return {"light", "dark", "dim"}; }

struct inner {
  double x = 0.5;
  shade tone = shade::dark;
  static constexpr auto fields = mpopt::fields(mpopt::field{"x", &inner::x, mpopt::checks::half_open(0, 1)},
                                               mpopt::field{"tone", &inner::tone});
  bool operator==(const inner&) const = default;
};

/// One field of every kind, and a check that involves two of them.
struct every_kind {
  double rate = 0.1;
  float small = 2.5f;
  bool on = true;
  std::int8_t tiny = -3;
  std::int64_t wide = -7;
  std::uint64_t count = 12;
  int steps = 4;
  inner nested = {};
  double low = 1, high = 2;

  static constexpr auto fields = mpopt::fields(
      mpopt::field{"rate", &every_kind::rate, mpopt::checks::rate},
      mpopt::field{"small", &every_kind::small, mpopt::checks::above(0)},
      mpopt::field{"on", &every_kind::on},
      mpopt::field{"tiny", &every_kind::tiny},
      mpopt::field{"wide", &every_kind::wide},
      mpopt::field{"count", &every_kind::count},
      mpopt::field{"steps", &every_kind::steps, mpopt::checks::closed(1, 64).because("one per bucket")},
      mpopt::field{"nested", &every_kind::nested},
      mpopt::field{"low", &every_kind::low},
      mpopt::field{"high", &every_kind::high});

  void validate(std::string_view where) const {
    if (low > high) mpopt::detail::fail(where, ".low must be <= high");
  }
  bool operator==(const every_kind&) const = default;
};

/// An integer whose bound lies where doubles are 2 apart.
struct step_limit {
  std::uint64_t steps = 1;
  static constexpr auto fields = mpopt::fields(mpopt::field{"steps", &step_limit::steps, mpopt::checks::closed(1, 0x1p53)});
};

std::string check_error(const every_kind& o) {
  return error_of([&] { mpopt::detail::check_options(o, "g"); });
}

template <class O>
O round_trip(const O& o) {
  const std::string text = mpopt::detail::options_json(o).dump();
  return mpopt::detail::options_from_json<O>(nlohmann::json::parse(text), "");
}

std::string read_error(const nlohmann::json& j) {
  return error_of([&] { (void)mpopt::detail::options_from_json<every_kind>(j, "saved "); });
}

}  // namespace

TEST_CASE("fields: each check names the field, its bound and the value, and validate() runs after the table") {
  CHECK(check_error({}) == no_error);
  auto with = [](auto change) {
    every_kind o;
    change(o);
    return check_error(o);
  };
  CHECK(with([](every_kind& o) { o.rate = -1; }) == "mpopt: g.rate must be >= 0, got -1");
  CHECK(with([](every_kind& o) { o.rate = NAN; }).starts_with("mpopt: g.rate must be a finite number, got "));
  CHECK(with([](every_kind& o) { o.rate = 1e300; }).starts_with("mpopt: g.rate must be finite as a float (at most "));
  CHECK(with([](every_kind& o) { o.small = 0; }) == "mpopt: g.small must be > 0, got 0");
  CHECK(with([](every_kind& o) { o.steps = 65; }) == "mpopt: g.steps must be in [1, 64], got 65: one per bucket");
  CHECK(with([](every_kind& o) { o.steps = 0; }) == "mpopt: g.steps must be in [1, 64], got 0: one per bucket");
  CHECK(with([](every_kind& o) { o.nested.x = 1; }) == "mpopt: g.nested.x must be in [0, 1), got 1");
  CHECK(with([](every_kind& o) { o.nested.tone = shade(3); }) == "mpopt: g.nested.tone holds no valid choice ((invalid))");
  CHECK(with([](every_kind& o) { o.low = 3; }) == "mpopt: g.low must be <= high");
  // A field's own check comes first.
  CHECK(with([](every_kind& o) { o.low = NAN; }).starts_with("mpopt: g.low must be a finite number"));
  // An integer is checked exactly, and shown exactly: 2^53 + 1 has no double of its own.
  auto limit_error = [](std::uint64_t steps) {
    return error_of([&] { mpopt::detail::check_options(step_limit{steps}, "g"); });
  };
  CHECK(limit_error(std::uint64_t(1) << 53) == no_error);
  CHECK(limit_error((std::uint64_t(1) << 53) + 1) == "mpopt: g.steps must be in [1, 9007199254740992], got 9007199254740993");
  CHECK(limit_error(~std::uint64_t(0)) == "mpopt: g.steps must be in [1, 9007199254740992], got 18446744073709551615");
}

TEST_CASE("fields: a record holds every kind exactly, at its extremes") {
  every_kind o;
  CHECK(round_trip(o) == o);
  o.rate = 0.1 + 1e-17;  // not the nearest double to a short decimal
  o.small = 1.0f / 3.0f;
  o.on = false;
  o.tiny = std::numeric_limits<std::int8_t>::min();
  o.wide = std::numeric_limits<std::int64_t>::min();
  o.count = std::numeric_limits<std::uint64_t>::max();
  o.steps = std::numeric_limits<int>::max();
  o.nested = {0.25, shade::dim};
  CHECK(round_trip(o) == o);
  o.tiny = std::numeric_limits<std::int8_t>::max();
  o.wide = std::numeric_limits<std::int64_t>::max();
  o.count = 0;
  CHECK(round_trip(o) == o);

  const nlohmann::json j = mpopt::detail::options_json(every_kind{});
  CHECK(j.at("nested").at("tone") == "dark");  // a choice by name, a nested struct as an object
  CHECK(j.at("tiny") == -3);
  CHECK(j.at("on") == true);
}

TEST_CASE("fields: a record that is missing a field, or holds one of the wrong type or range, is refused by name") {
  const nlohmann::json good = mpopt::detail::options_json(every_kind{});
  auto with = [&](auto change) {
    nlohmann::json j = good;
    change(j);
    return read_error(j);
  };
  CHECK(read_error(good) == no_error);
  CHECK(with([](nlohmann::json& j) { j.erase("rate"); }) == "mpopt: saved rate is missing");
  CHECK(with([](nlohmann::json& j) { j["rate"] = "0.1"; }).starts_with("mpopt: saved rate must be a number"));
  CHECK(with([](nlohmann::json& j) { j["on"] = 1; }).starts_with("mpopt: saved on must be true or false"));
  CHECK(with([](nlohmann::json& j) { j["count"] = 1.5; }) == "mpopt: saved count must be an integer, got 1.5");
  CHECK(with([](nlohmann::json& j) { j["count"] = -1; }) == "mpopt: saved count does not fit its integer type, got -1");
  CHECK(with([](nlohmann::json& j) { j["tiny"] = 128; }) == "mpopt: saved tiny does not fit its integer type, got 128");
  CHECK(with([](nlohmann::json& j) { j["tiny"] = -129; }) == "mpopt: saved tiny does not fit its integer type, got -129");
  CHECK(with([](nlohmann::json& j) { j["nested"] = 3; }) == "mpopt: saved nested must be a JSON object, got 3");
  CHECK(with([](nlohmann::json& j) { j["nested"].erase("x"); }) == "mpopt: saved nested.x is missing");
  CHECK(with([](nlohmann::json& j) { j["nested"]["tone"] = "bright"; }) ==
        "mpopt: saved nested.tone must be one of \"light\", \"dark\", \"dim\", got \"bright\"");
  CHECK(with([](nlohmann::json& j) { j["nested"]["tone"] = 1; }) == "mpopt: saved nested.tone must be a string, got 1");
  // Members the record has besides are a later version's: ignored.
  CHECK(with([](nlohmann::json& j) { j["future"] = 1; }) == no_error);
}

TEST_CASE("fields: settings name each leaf, nested ones by their path, with values that read back exactly") {
  std::vector<mpopt::detail::setting> all;
  every_kind o;
  o.rate = 0.1;
  o.count = std::numeric_limits<std::uint64_t>::max();
  mpopt::detail::add_field_settings(all, "group 0.", mpopt::detail::field_refs(o));
  std::vector<std::string> seen;
  for (const auto& s : all) seen.push_back(s.name + "=" + s.value);
  const std::vector<std::string> expected = {
      "group 0.rate=0.1",  "group 0.small=2.5",   "group 0.on=true", "group 0.tiny=-3",
      "group 0.wide=-7",   "group 0.count=18446744073709551615",     "group 0.steps=4",
      "group 0.nested.x=0.5", "group 0.nested.tone=dark", "group 0.low=1", "group 0.high=2"};
  CHECK(seen == expected);
}

TEST_CASE_TEMPLATE("fields: the built-in options' defaults pass their checks and survive a record", O, mpopt::adam::options,
                   mpopt::lamb::options, mpopt::onebit_adam_options, mpopt::onebit_lamb_options,
                   mpopt::zero_one_adam_options, mpopt::optimizer_options, mpopt::dynamic_scale_options,
                   mpopt::static_scale_options, mpopt::compression_options) {
  const O o{};
  CHECK(error_of([&] { mpopt::detail::check_options(o, "x"); }) == no_error);
  const nlohmann::json j = mpopt::detail::options_json(o);
  CHECK(mpopt::detail::options_json(round_trip(o)) == j);
}

TEST_CASE("fields: choices are read by name, and a name that is none of them is refused with the list") {
  CHECK(mpopt::detail::choice_of<mpopt::compression_scale>("global", "s") == mpopt::compression_scale::global);
  CHECK(mpopt::detail::choice_of<mpopt::at_min_scale>("keep_skipping", "s") == mpopt::at_min_scale::keep_skipping);
  CHECK(error_of([] { (void)mpopt::detail::choice_of<mpopt::accumulation>("median", "combine"); }) ==
        "mpopt: combine must be one of \"mean\", \"sum\", got \"median\"");
}
