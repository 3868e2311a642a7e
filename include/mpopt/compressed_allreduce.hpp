// mpopt — the error-compensated 1-bit all-reduce of 1-bit Adam and 1-bit LAMB (DeepSpeed
// deepspeed/runtime/comm/nccl.py, compressed_allreduce), over any communicator.
//
// Every rank averages an n-element vector x, sending about n/4 bytes instead of 4n (2n/8 with
// an all-to-all and an all-gather):
//   worker:  y = x + e_w;  s = ||y|| / sqrt(N);  signs of y (sign_compression.hpp);  e_w = y - (±s)
//   phase 1: all-to-all of the sign bits (chunk r, elements [r N/W, (r+1) N/W), goes to rank r),
//            all-gather of the W worker scales
//   server:  for my chunk, c = sum_r (±s_r / W) + e_s;  s_c = ||c|| / sqrt(N/W);  signs of c;
//            e_s = c - (±s_c)
//   phase 2: all-gather of the server sign bits and scales; result element i = ±s_c of its chunk.
// N is n padded to a multiple of 8 W (each chunk a whole number of bytes); the padding takes part
// as zeros at every call (DeepSpeed compresses its buffer in place, so from its second call the
// padding holds the last result: docs/compressed-rules.md, "1-bit LAMB"). The error buffers e_w (N) and e_s (N / W)
// persist across calls: that is the error feedback. Sums of squares are formed in double, per
// 64 Ki-element chunk and then across chunks in a fixed order: the scales do not depend on the
// thread count, nor (to the float they are rounded to) on how the sum was cut.
//
// Per segment: built from segment sizes (the compressing rules' tensors), each segment starts at a
// multiple of 16 and has scales of its own: the worker's over its elements, the server's over its
// piece of each chunk (N is then a multiple of 16 W). Padding between segments takes no part.
//
// The buffers live where the Backend computes (host.hpp, cuda.hpp); every call that runs passes
// takes that backend object.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "communicator.hpp"
#include "detail/comm/agree.hpp"
#include "detail/math/sign_compression.hpp"
#include "detail/options/validate.hpp"
#include "detail/passes/work_list.hpp"
#include "host.hpp"

namespace mpopt {

template <class Backend = host>
class compressed_allreduce {
 public:
  compressed_allreduce() = default;

  /// For vectors of `elements` on `world` ranks, this one being `rank`, with one scale per rank and
  /// one per chunk. Errors start at zero.
  compressed_allreduce(std::size_t elements, int world, int rank) : world_(check_rank(world, rank)), rank_(std::size_t(rank)) {
    size_ = elements;
    padded_ = padded_for(elements, world);
    starts_ = {0};
    lay_out({&size_, 1});
  }

  /// For vectors made of segments of these sizes, each with scales of its own: segment k starts at
  /// segment_start(k), a multiple of 16. Errors start at zero.
  compressed_allreduce(std::span<const std::size_t> segments, int world, int rank)
      : world_(check_rank(world, rank)), rank_(std::size_t(rank)), segmented_(true) {
    if (segments.empty()) detail::fail("compressed_allreduce: no segments");
    for (std::size_t at = 0; const std::size_t n : segments) {
      starts_.push_back(at);
      at += round_up(n, 16);
      size_ += n;
    }
    padded_ = padded_for(segments, world);
    lay_out(segments);
  }

  /// padded_size() of an exchange of `elements`, or of these segments, on `world` ranks.
  static std::size_t padded_for(std::size_t elements, int world) { return round_up(elements, 8 * std::size_t(world)); }
  static std::size_t padded_for(std::span<const std::size_t> segments, int world) {
    std::size_t n = 0;
    for (const std::size_t s : segments) n += round_up(s, 16);
    return round_up(n, 16 * std::size_t(world));
  }

  /// Checks that `comm` delivers what the exchange needs: bytes to the right rank in an all-to-all,
  /// bytes and floats in the right place in all-gathers. If any rank found a fault, every rank
  /// throws ("<user> preflight: ..."). Collective; nothing to check on one rank.
  template <communicator C>
  static void preflight(C& comm, std::string_view user) {
    if (comm.size() == 1) return;  // one rank's single block cannot go astray
    const std::size_t w = std::size_t(comm.size()), r = std::size_t(comm.rank());
    auto code = [](std::size_t from, std::size_t to) { return std::uint8_t(from * 31 + to * 7 + 1); };
    std::vector<std::uint8_t> sent(w), received(w), gathered(w, 0);
    std::vector<float> ranks(w, -1.0f);
    const std::vector<std::size_t> ones(w, 1);
    std::string problem;
    try {
      for (std::size_t j = 0; j < w; ++j) sent[j] = code(r, j);
      comm.all_to_all(std::span<const std::uint8_t>(sent), std::span<std::uint8_t>(received));
      gathered[r] = std::uint8_t(r + 1);
      comm.all_gather(std::span<std::uint8_t>(gathered), std::span<const std::size_t>(ones));
      const float mine = float(r);
      comm.all_gather(std::span<const float>(&mine, 1), std::span<float>(ranks));
      for (std::size_t i = 0; i < w && problem.empty(); ++i) {
        if (received[i] != code(i, r)) problem = "all_to_all of bytes delivered the wrong block from rank " + std::to_string(i);
        else if (gathered[i] != std::uint8_t(i + 1)) problem = "all_gather of bytes put rank " + std::to_string(i) + "'s piece elsewhere";
        else if (ranks[i] != float(i)) problem = "all_gather of floats put rank " + std::to_string(i) + "'s value elsewhere";
      }
    } catch (const error& e) {
      problem = e.what();
    }
    detail::agree(comm, std::string(user) + " preflight", [&] {
      if (!problem.empty()) detail::fail(user, " preflight on ", C::name, " (rank ", r, " of ", w, "): ", problem);
    });
  }

  /// Elements: every segment's, without padding.
  std::size_t size() const { return size_; }
  /// Segments with scales of their own (built without: 1, the whole vector).
  std::size_t segments() const { return starts_.size(); }
  /// Where segment k starts in the exchanged vector (and in worker_error()).
  std::size_t segment_start(std::size_t k) const { return starts_[k]; }
  /// The exchanged vector's length: size() rounded up to a multiple of 8 W, or with segments their
  /// sizes rounded up to multiples of 16, then to one of 16 W.
  std::size_t padded_size() const { return padded_; }
  /// Elements each rank averages as a server: padded_size() / W.
  std::size_t chunk_size() const { return chunk_; }

  /// x = the average of x over ranks, 1-bit compressed with error feedback. Every rank calls it
  /// with the same size.
  template <communicator C>
  void average(C& comm, Backend& backend, std::span<float> x) {
    if (x.size() != size_) detail::fail("compressed_allreduce: ", x.size(), " elements, built for ", size_);
    if (segmented_) detail::fail("compressed_allreduce: average() exchanges a vector without segments");
    backend.add_into(prefix(size_), worker_error_.data(), x.data(), partial_.data());
    backend.synchronize();
    const double fed = ordered_sum(0, prefix(size_).size());
    exchange(comm, backend, {&fed, 1});
    backend.decode_signs(prefix(size_), result(), x.data());
    backend.synchronize();
  }

  // ---- The pieces average() is made of, for callers that fuse the first and last step into their
  // own passes (1-bit LAMB adds its momentum into the worker error while computing it, and reads
  // the result while updating).

  /// Where this rank's vector goes: add x_i into element i (< size()); the buffer holds the last
  /// round's error, so adding is the error feedback. Also the error itself, for checkpoints.
  std::span<float> worker_error() { return worker_error_.span(); }
  std::span<const float> worker_error() const { return worker_error_.span(); }
  /// This rank's server error (its chunk), for checkpoints.
  std::span<float> server_error() { return server_error_.span(); }
  std::span<const float> server_error() const { return server_error_.span(); }

  /// Compresses the worker buffer and runs both phases. fed_sumsq[k] is the sum of squares of
  /// segment k's elements of worker_error() after x was added (with one segment, the padding's part
  /// is added here). Collective.
  template <communicator C>
  void exchange(C& comm, Backend& backend, std::span<const double> fed_sumsq) {
    compress_worker(backend, fed_sumsq);
    finish(comm, backend);
  }

  /// Local: the worker's scales, sign bits and new error. finish() does the rest.
  void compress_worker(Backend& backend, std::span<const double> fed_sumsq) {
    if (phase_ != phase::idle) detail::fail("compressed_allreduce: the previous exchange did not finish");
    if (fed_sumsq.size() != segments())
      detail::fail("compressed_allreduce: ", fed_sumsq.size(), " sums of squares for ", segments(), " segments");
    if (!segmented_) {
      double sumsq = fed_sumsq[0];
      backend.to_host(padding_.data(), worker_error_.data() + size_, padding_.size());  // fewer than 8 W
      for (float e : padding_) sumsq += double(e) * double(e);
      my_scales_[0] = padded_ ? float(std::sqrt(sumsq / double(padded_))) : 0.0f;
    } else {
      for (std::size_t k = 0; k < segments(); ++k)
        my_scales_[k] = sizes_[k] ? float(std::sqrt(fed_sumsq[k] / double(sizes_[k]))) : 0.0f;
    }
    if (padded_) backend.compress_signs(worker_, worker_error_.data(), my_scales_.data(), sent_.data());
    backend.synchronize();
    phase_ = phase::send;
  }

  /// Runs the phases still to run. A collective that throws leaves its phase to run again on the
  /// next call: the local state before it is intact, so a failure loses nothing. Collective.
  template <communicator C>
  void finish(C& comm, Backend& backend) {
    if (padded_ == 0) {
      phase_ = phase::idle;
      return;
    }
    if (phase_ == phase::send) {
      comm.all_to_all(std::span<const std::uint8_t>(sent_.data(), padded_ / 8), std::span<std::uint8_t>(received_.data(), padded_ / 8));
      comm.all_gather(std::span<const float>(my_scales_), std::span<float>(worker_scales_));
      phase_ = phase::combine;
    }
    if (phase_ == phase::combine) {
      combine(backend);
      phase_ = phase::gather;
    }
    if (phase_ == phase::gather) {
      comm.all_gather(std::span<std::uint8_t>(result_.data(), padded_ / 8), std::span<const std::size_t>(counts_));
      comm.all_gather(std::span<const float>(my_server_scales_), std::span<float>(server_scales_));
      phase_ = phase::idle;
    }
  }

  /// Drops an unfinished exchange (its errors have already advanced), e.g. before loading errors.
  void cancel() { phase_ = phase::idle; }

  /// Whether an exchange started and has phases left (finish() runs them).
  bool pending() const { return phase_ != phase::idle; }

  /// The result of the last exchange: element i (of segment k) is ±the scale of its chunk (its
  /// segment's piece of that chunk).
  detail::sign_code result() const {
    return {result_.data(), server_scales_.data(), chunk_ ? chunk_ : 1, world_, segments()};
  }

  /// Bytes this rank hands the communicator per exchange: its sign bits to the all-to-all, one
  /// chunk's bits to the all-gather, and two scales per segment.
  std::size_t bytes_per_exchange() const {
    return padded_ ? padded_ / 8 + chunk_ / 8 + 2 * segments() * sizeof(float) : 0;
  }

  /// Heap bytes held, by purpose.
  struct memory {
    std::size_t worker_error, server_error, sign_bits, bookkeeping;
    std::size_t total() const { return worker_error + server_error + sign_bits + bookkeeping; }
  };
  memory memory_use() const {
    return {worker_error_.size() * sizeof(float), server_error_.size() * sizeof(float),
            sent_.size() + received_.size() + result_.size(),
            (worker_scales_.capacity() + server_scales_.capacity() + my_scales_.capacity() +
             my_server_scales_.capacity() + padding_.capacity()) * sizeof(float) +
                partial_.capacity() * sizeof(double) +
                (counts_.capacity() + starts_.capacity() + sizes_.capacity() + piece_sizes_.capacity()) * sizeof(std::size_t) +
                worker_.bytes() + server_.bytes() + prefix_.bytes()};
  }

  /// Zeroes both error buffers in place (a fresh start of the error feedback, allocating nothing).
  void zero_errors(Backend& backend) {
    backend.zero(worker_error_.data(), padded_);
    backend.zero(server_error_.data(), chunk_);
    backend.synchronize();
  }

  /// Zeroes both error buffers (a fresh start of the error feedback).
  void reset_errors() {
    worker_error_ = buffer<float>::zeroed(padded_);
    server_error_ = buffer<float>::zeroed(chunk_);
  }

 private:
  enum class phase : std::uint8_t { idle, send, combine, gather };
  template <class T>
  using buffer = typename Backend::template buffer<T>;
  template <class T>
  using shared = typename Backend::template shared_vector<T>;

  static std::size_t check_rank(int world, int rank) {
    if (world < 1 || rank < 0 || rank >= world)
      detail::fail("compressed_allreduce: rank ", rank, " of ", world, " is not a rank of the world");
    return std::size_t(world);
  }
  static std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }

  /// The buffers and work lists, once starts_ and padded_ are known: the worker compresses each
  /// segment's elements, the server my chunk's piece of each (with one segment: everything).
  void lay_out(std::span<const std::size_t> sizes) {
    const bool one = !segmented_;
    sizes_.assign(sizes.begin(), sizes.end());
    chunk_ = padded_ / world_;
    reset_errors();
    sent_ = buffer<std::uint8_t>::zeroed(detail::sign_bytes(padded_));
    received_ = buffer<std::uint8_t>::zeroed(detail::sign_bytes(padded_));
    result_ = buffer<std::uint8_t>::zeroed(detail::sign_bytes(padded_));
    padding_.assign(one ? padded_ - size_ : 0, 0.0f);
    my_scales_.assign(segments(), 0.0f);
    my_server_scales_.assign(segments(), 0.0f);
    worker_scales_.assign(world_ * segments(), 0.0f);
    server_scales_.assign(world_ * segments(), 0.0f);
    counts_.assign(world_, chunk_ / 8);
    piece_sizes_.assign(segments(), one ? chunk_ : 0);
    if (one) {
      worker_.add(0, 0, padded_, 0);
      server_.add(0, 0, chunk_, 0);
    }
    const std::size_t mine = rank_ * chunk_;
    for (std::size_t k = 0; k < segments() && !one; ++k) {
      const std::size_t first = starts_[k], last = first + sizes_[k];
      worker_.add(std::uint32_t(k), 0, sizes_[k], first);
      const std::size_t lo = std::max(first, mine), hi = std::min(last, mine + chunk_);
      if (hi <= lo) continue;
      server_.add(std::uint32_t(k), lo - first, hi - first, lo - mine);  // chunks at 16-element boundaries
      piece_sizes_[k] = hi - lo;
    }
    partial_.assign(std::max(worker_.size(), server_.size()), 0.0);
  }

  /// The server's part: average my chunk of every rank's signs into the server error, then
  /// compress it into my chunk of the result bits.
  void combine(Backend& backend) {
    const float inv_world = 1.0f / float(world_);
    for (float& s : worker_scales_) s = s * inv_world;  // DeepSpeed: s_r * (1 / W)
    backend.combine_signs(server_, received_.data(), chunk_ / 8, worker_scales_.data(), int(world_), segments(),
                          server_error_.data(), partial_.data());
    backend.synchronize();
    for (std::size_t k = 0; k < segments(); ++k) {
      const double sumsq = ordered_sum(server_.first_chunk(k), server_.first_chunk(k + 1));
      my_server_scales_[k] = piece_sizes_[k] ? float(std::sqrt(sumsq / double(piece_sizes_[k]))) : 0.0f;
    }
    backend.compress_signs(server_, server_error_.data(), my_server_scales_.data(), result_.data() + rank_ * (chunk_ / 8));
    backend.synchronize();
  }

  /// The chunks of worker_ covering [0, n) (n <= padded_): a prefix of the worker list.
  const detail::work_list& prefix(std::size_t n) {
    if (n == padded_) return worker_;
    if (prefix_.elements() != n) {
      prefix_ = {};
      if (n) prefix_.add(0, 0, n, 0);
    }
    return prefix_;
  }

  double ordered_sum(std::size_t c0, std::size_t c1) const {
    double s = 0;
    for (std::size_t c = c0; c < c1; ++c) s += partial_[c];
    return s;
  }

  std::size_t size_ = 0, padded_ = 0, chunk_ = 0, world_ = 1, rank_ = 0;
  bool segmented_ = false;  // scales per segment
  buffer<float> worker_error_, server_error_;
  buffer<std::uint8_t> sent_, received_, result_;  // sign bits: mine, my chunk of every rank's, the result
  shared<float> worker_scales_, server_scales_;
  shared<float> my_scales_, my_server_scales_;  // per segment
  std::vector<std::size_t> counts_, starts_, sizes_;  // per segment: where it starts, its elements
  std::vector<std::size_t> piece_sizes_;  // per segment: its elements in my chunk
  detail::work_list worker_, server_, prefix_;  // chunks' `tensor`: their segment
  shared<double> partial_;       // per chunk: sums of squares
  std::vector<float> padding_;   // one segment: the worker error's padding, read on the host
  phase phase_ = phase::idle;
};

}  // namespace mpopt
