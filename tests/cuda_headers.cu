// cuda_headers.cpp built by nvcc: the library under nvcc, and on a GPU the device's element math.
#include "cuda_headers.cpp"
