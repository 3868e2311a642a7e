// EITHER(bad, good): the malformed form of a compile-fail test's policy, or with MALFORMED_FIXED the
// mended one (tests/compile_fail.py builds both).
#pragma once

#ifdef MALFORMED_FIXED
#define EITHER(bad, ...) __VA_ARGS__
#else
#define EITHER(bad, ...) bad
#endif
