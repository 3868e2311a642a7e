// device_passes.cpp built by nvcc: the device backend's kernels on a GPU against the host backend.
#include "device_passes.cpp"
