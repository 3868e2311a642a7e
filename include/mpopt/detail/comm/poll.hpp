// mpopt — waiting on something that can only be polled (an MPI request, a CUDA stream), with an
// optional time limit.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace mpopt::detail {

/// Calls done() until it returns true (then returns true) or `limit` has passed (then false); a
/// zero limit waits forever. It polls back to back for the first 100 µs, when the wait is most
/// likely about to end, then yields between polls, and after 50 ms sleeps between them, for a
/// thousandth of the time waited so far (50 µs to 1 ms): a rank left waiting for a late peer gives
/// its core to the ranks still working (on an oversubscribed machine they share cores), while a
/// long collective, whose data MPI moves only inside its calls, is still polled often.
template <class Done>
bool poll_until(std::chrono::milliseconds limit, Done&& done) {
  using namespace std::chrono;
  const auto start = steady_clock::now();
  for (;;) {
    if (done()) return true;
    const auto waited = steady_clock::now() - start;
    if (limit.count() > 0 && waited >= limit) return false;
    if (waited < microseconds(100)) continue;
    if (waited < milliseconds(50)) {
      std::this_thread::yield();
      continue;
    }
    const steady_clock::duration nap = waited / 1000;
    std::this_thread::sleep_for(std::clamp<steady_clock::duration>(nap, microseconds(50), milliseconds(1)));
  }
}

}  // namespace mpopt::detail
