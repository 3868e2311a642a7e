// mpopt — <mpi.h>, its C API only: Open MPI's C++ bindings warn under -Wextra.
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>
