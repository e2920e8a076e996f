#pragma once
// stub (gloo/common/error.h): included by ProcessGroupGloo.hpp, nothing used.
