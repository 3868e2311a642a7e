// device_muon.cpp built by nvcc: Muon's matrix stage on cuBLAS against the host backend's, on a GPU.
#include "device_muon.cpp"
