// <MetalPerformancePrimitives.h>: Metal 4's tensor operations, which the mtwork emulator
// (compute kernels only) lacks. Including it stops compilation with one clear message.
#pragma once
#pragma clang diagnostic fatal "-W#warnings"
#warning Metal 4 tensor APIs (MetalPerformancePrimitives, mpp::tensor_ops) are not supported by the mtwork emulator
