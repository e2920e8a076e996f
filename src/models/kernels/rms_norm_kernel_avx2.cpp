// The avx2 build of the fused RMSNorm kernel (flags in src/CMakeLists.txt).
#include "rms_norm_kernel.inc"
