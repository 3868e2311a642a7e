// The snippets of docs/extending.md, "Migrating a rule to fields" (before and after), made a
// translation unit; the stand-ins are the two options structs around them, require_in and the bodies.
#include <mpopt/fields.hpp>

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace before {

void require_in(const std::string&, double, double, double) {}

struct options {
  double lr = 1e-3, beta1 = 0.9;
  // before
  void validate(std::string_view g) const {
    require_in(std::string(g) + ".lr", lr, 0, 1e30);
    require_in(std::string(g) + ".beta1", beta1, 0, 1);
  }
  static nlohmann::json to_json(const options& o) {
    return {{"lr", o.lr}, {"beta1", o.beta1}};
  }
  static options from_json(const nlohmann::json& j) {
    return {j.at("lr").get<double>(), j.at("beta1").get<double>()};
  }
};

}  // namespace before

namespace after {

struct options {
  double lr = 1e-3, beta1 = 0.9;
  // after
  static constexpr auto fields = mpopt::fields(
      mpopt::field{"lr", &options::lr, mpopt::checks::rate},
      mpopt::field{"beta1", &options::beta1, mpopt::checks::closed(0, 1)});
};

}  // namespace after
