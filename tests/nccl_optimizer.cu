// cross_backend.cpp built by nvcc: mpopt::cuda over mpopt::nccl, one GPU per rank, against the host
// backend over MPI.
#define MPOPT_TEST_NCCL 1
#include "cross_backend.cpp"
