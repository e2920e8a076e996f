// Precompiled header for loom targets that use LibTorch: the narrow ATen/c10 and nn::Module
// headers most of them need. Keep <torch/torch.h> out of here and out of loom's headers (it costs
// ~20 s a file).
#pragma once
#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
