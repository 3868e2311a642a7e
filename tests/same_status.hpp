// Two step statuses alike in every field, their doubles bit for bit: a resumed run against the one
// it continues (state.cpp), a run that refused bad input against one that never saw it (bad_input.cpp).
#pragma once

#include <doctest/doctest.h>

#include <mpopt/status.hpp>

#include <bit>
#include <cstdint>

inline bool bitwise_equal(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

inline void check_same_status(const mpopt::step_status& a, const mpopt::step_status& b) {
  CHECK(a.result == b.result);
  CHECK(a.applied == b.applied);
  CHECK(bitwise_equal(a.scale_before, b.scale_before));
  CHECK(bitwise_equal(a.scale_after, b.scale_after));
  CHECK(bitwise_equal(a.grad_norm, b.grad_norm));
  CHECK(bitwise_equal(a.grad_norm_clipped, b.grad_norm_clipped));
  CHECK(bitwise_equal(a.clip_coef, b.clip_coef));
  CHECK(a.step == b.step);
  CHECK(a.skipped_steps == b.skipped_steps);
  CHECK(a.consecutive_skips == b.consecutive_skips);
  CHECK(a.micro_step == b.micro_step);
}
