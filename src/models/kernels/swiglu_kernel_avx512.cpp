// The avx512 build of the fused SwiGLU kernel (flags in src/CMakeLists.txt).
#include "swiglu_kernel.inc"
