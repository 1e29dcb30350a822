// metalgen kernel prelude, CUDA, after a variant's #defines: the last text before the signature that
// MLX writes itself ("__global__ void <name>(...)", mlx/backend/cuda/custom_kernel.cpp).
#pragma once

// The persistent decode megakernel (MG_GRID 1) needs its whole grid co-resident: 2 groups of 256
// threads per multiprocessor (metalgen/decode/gpu.py), else its grid barrier never opens. MLX offers
// no way to pass launch bounds, so they ride on the __global__ macro: the compiler then keeps the
// kernel within 128 registers a thread (spilling rather than exceeding them) whatever its version.
// (The fused path's launches, MG_GRID 0, need no co-residency: bounded, they spilled.)
#if MG_GRID
#undef __global__
#define __global__ __location__(global) __launch_bounds__(256, 2)
#endif
