// The avx2 build of the fused rotary embedding (flags in src/CMakeLists.txt).
#include "rotary_kernel.inc"
