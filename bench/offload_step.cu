// offload_step.cpp built by nvcc: the model's tensors in a GPU's memory, the copies over its bus.
#include "offload_step.cpp"
