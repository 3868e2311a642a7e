// mpopt — the library's version, and the language it needs: every public header includes this first,
// so an older -std fails here with a message instead of deep in a concept.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "mpopt needs C++20 (concepts, designated initializers, std::span): compile with -std=c++20 or later"
#endif

// Kept equal to meson.build's project version (meson.build checks it).
#define MPOPT_VERSION_MAJOR 0
#define MPOPT_VERSION_MINOR 1
#define MPOPT_VERSION_PATCH 0

namespace mpopt {

struct version_number {
  int major, minor, patch;
};
/// The version of these headers: mpopt::version.major, .minor, .patch.
inline constexpr version_number version{MPOPT_VERSION_MAJOR, MPOPT_VERSION_MINOR, MPOPT_VERSION_PATCH};

}  // namespace mpopt
