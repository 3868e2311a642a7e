// The snippet of docs/install.md, "Faster builds: the separately compiled mode", made a translation
// unit; the stand-in is the #define, which the snippet's build gives on the command line.
#define MPOPT_SEPARATE_COMPILATION
// mpopt.cpp, one unit of your program, built like the others (with -DMPOPT_SEPARATE_COMPILATION)
#include <mpopt/src.hpp>
