// The replacement operator new whose counts counting_new.hpp reads, once per test program.
#include "counting_new.hpp"

#include <cstdlib>
#include <new>

std::atomic<long long> counting_new::live_bytes{0};
std::atomic<long long> counting_new::peak_bytes{0};

namespace {
using counting_new::live_bytes;
using counting_new::peak_bytes;

// Each block carries its size and header length just before the pointer handed out.
void* counted_new(std::size_t n, std::size_t align) {
  const std::size_t header = align < 64 ? 64 : align;  // room for the record, keeps the alignment
  char* base = static_cast<char*>(std::aligned_alloc(header, (n + header + header - 1) / header * header));
  if (!base) throw std::bad_alloc();
  char* p = base + header;
  reinterpret_cast<std::size_t*>(p)[-1] = n;
  reinterpret_cast<std::size_t*>(p)[-2] = header;
  const long long now = live_bytes += static_cast<long long>(n);
  for (long long seen = peak_bytes.load(); now > seen && !peak_bytes.compare_exchange_weak(seen, now);) {
  }
  return p;
}
void counted_delete(void* p) noexcept {
  if (!p) return;
  const std::size_t n = static_cast<std::size_t*>(p)[-1];
  const std::size_t header = static_cast<std::size_t*>(p)[-2];
  live_bytes -= static_cast<long long>(n);
  std::free(static_cast<char*>(p) - header);
}
}  // namespace

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) { return counted_new(n, 16); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_new(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { counted_delete(p); }
void operator delete(void* p, std::size_t) noexcept { counted_delete(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_delete(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { counted_delete(p); }
// The nothrow forms (std::stable_sort's buffer) call the ones above by default, but a sanitizer's
// runtime supplies its own, whose blocks would reach counted_delete without a header.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_new(n, 16);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return counted_new(n, static_cast<std::size_t>(a));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_delete(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_delete(p); }

