// Steps of mpopt::muon (fp32 parameters, one group, no clipping) on matrices a JSON file gives, for
// tests/torch_muon.py, which runs torch.optim.Muon on the same:
//
//   muon_steps IN.json OUT.json
//
// IN: {"options": {muon_options' fields}, "shapes": [[rows, cols], ...], "params": [[...], ...],
//      "grads": [[[...], ...], ...] (per step, per tensor)}
// OUT: {"params": [[[...], ...], ...]}: per step, every tensor's parameters after it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <mpopt/detail/options/fields_json.hpp>
#include <mpopt/muon.hpp>
#include <mpopt/optimizer.hpp>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: muon_steps IN.json OUT.json\n");
    return 2;
  }
  try {
    const nlohmann::json in = nlohmann::json::parse(std::ifstream(argv[1]));
    mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::muon> opt({.clip_grad = 0});
    const auto o = mpopt::detail::options_from_json<mpopt::muon_options>(in.at("options"), "");
    auto& group = opt.add_group(o);
    std::vector<std::vector<float>> params, grads;
    for (std::size_t t = 0; t < in.at("shapes").size(); ++t) {
      params.push_back(in.at("params")[t].get<std::vector<float>>());
      grads.emplace_back(params.back().size());
    }
    for (std::size_t t = 0; t < params.size(); ++t)
      group.add(params[t], grads[t], "w" + std::to_string(t), in.at("shapes")[t].get<std::vector<std::int64_t>>());
    nlohmann::json out = {{"params", nlohmann::json::array()}};
    for (const auto& step : in.at("grads")) {
      for (std::size_t t = 0; t < grads.size(); ++t) {  // into the registered buffers, in place
        const auto g = step[t].get<std::vector<float>>();
        if (g.size() != grads[t].size()) throw mpopt::error("a gradient of another size than its tensor");
        std::copy(g.begin(), g.end(), grads[t].begin());
      }
      if (!opt.step().applied) throw mpopt::error("a step was not applied");
      out["params"].push_back(params);
    }
    std::ofstream(argv[2]) << out.dump();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "muon_steps: %s\n", e.what());
    return 1;
  }
}
