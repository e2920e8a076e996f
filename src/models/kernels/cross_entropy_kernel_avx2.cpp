// The avx2 build of the fused cross-entropy (flags in src/CMakeLists.txt).
#include "cross_entropy_kernel.inc"
