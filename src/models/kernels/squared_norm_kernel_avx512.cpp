// The avx512 build of the float64 sum of squares (flags in src/CMakeLists.txt).
#include "squared_norm_kernel.inc"
