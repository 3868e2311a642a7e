// offload.cpp built by nvcc: the offloaded optimizer's tensors in a GPU's memory, copied over the bus.
#define MPOPT_TEST_GPU 1
#include "offload.cpp"
