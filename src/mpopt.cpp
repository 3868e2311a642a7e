// The separately compiled mode's unit (meson: dependency('mpopt-compiled'); include/mpopt/src.hpp).
#include <mpopt/src.hpp>
