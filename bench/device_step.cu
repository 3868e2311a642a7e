// device_step.cpp built by nvcc: the device benchmark on a GPU (exits 77 without one).
#include "device_step.cpp"
