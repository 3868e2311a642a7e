// What the replacement operator new of counting_new.cpp counts: the live heap bytes and their peak,
// for tests that check what the optimizer reports against what it really allocates. A test program
// that includes this links counting_new.cpp (tests/meson.build).
#pragma once

#include <atomic>

namespace counting_new {
extern std::atomic<long long> live_bytes;
extern std::atomic<long long> peak_bytes;
}  // namespace counting_new

namespace {
template <class F>
long long live_bytes_added_by(F&& f) {
  const long long before = counting_new::live_bytes.load();
  f();
  return counting_new::live_bytes.load() - before;
}
/// The most f had allocated at once beyond what was live before it.
template <class F>
long long peak_bytes_added_by(F&& f) {
  const long long before = counting_new::live_bytes.load();
  counting_new::peak_bytes = before;
  f();
  return counting_new::peak_bytes.load() - before;
}
}  // namespace
