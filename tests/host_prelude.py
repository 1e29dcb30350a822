"""The kernel preludes' vocabulary on the host, for tests that run shared prelude functions through g++
(tests/test_kernels_qdot.py, tests/test_kernels_decode_prelude.py): T is bf16 held as its 16 bits, device
and shared memory are plain memory, a lane-group is one thread. Also bf16 rounding on the numpy side."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kernels_metal import source as S

GXX = shutil.which("g++") or shutil.which("clang++")

PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#define MG_FN inline
#define MG_DEVICE
#define MG_SHARED_PTR
struct mg_u4 { uint32_t x, y, z, w; };
struct mg_f2 { float x, y; };
struct bf16 { uint16_t bits; };
#define MG_LOAD_U4(ptr) (*((const mg_u4*)(ptr)))
#define MG_LOAD_U4_NC(ptr) (*((const mg_u4*)(ptr)))
#define MG_LOAD_U4_STREAM(ptr) (*((const mg_u4*)(ptr)))
#define MG_LOAD_CG_U4(ptr) (*((const mg_u4*)(ptr)))
#define MG_LOAD_SHARED_U4(ptr) (*((const mg_u4*)(ptr)))
#define MG_DEVICE_ADD_F32(ptr, v) (*(ptr) += (v))
#define MG_LOAD_CG(ptr) (*(ptr))
#define MG_ASYNC_COPY16(dst, src) (*((mg_u4*)(dst)) = *((const mg_u4*)(src)))
MG_FN float mg_inf() { return INFINITY; }
MG_FN float mg_fmax(float a, float b) { return std::fmax(a, b); }
MG_FN float mg_exp(float x) { return std::exp(x); }
MG_FN float mg_fabs(float x) { return std::fabs(x); }
MG_FN int mg_rint_i(float x) { return (int)std::nearbyint(x); }
// c + the products of a's two signed 16-bit halves with b's bytes 0, 1 (lo) or 2, 3 (hi), as the GPU's dp2a
MG_FN int mg_dp2a_lo(uint32_t a, uint32_t b, int c) {
  return c + (int)(int16_t)(a & 0xFFFFu) * (int)(int8_t)(b & 0xFFu) + (int)(int16_t)(a >> 16) * (int)(int8_t)((b >> 8) & 0xFFu);
}
MG_FN int mg_dp2a_hi(uint32_t a, uint32_t b, int c) {
  return c + (int)(int16_t)(a & 0xFFFFu) * (int)(int8_t)((b >> 16) & 0xFFu) + (int)(int16_t)(a >> 16) * (int)(int8_t)(b >> 24);
}
static float bits_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
MG_FN float mg_as_float(uint32_t u) { return bits_float(u); }
MG_FN float mg_lanes_sum(float v) { return v; }
MG_FN float mg_lanes_xor(float v, uint32_t) { return v; }
MG_FN mg_u4 mg_u4_zero() { return {0u, 0u, 0u, 0u}; }
MG_FN uint32_t mg_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
template <typename T> MG_FN mg_f2 mg_unpack2(uint32_t u);
template <> MG_FN mg_f2 mg_unpack2<bf16>(uint32_t u) { return {bits_float(u << 16), bits_float(u & 0xFFFF0000u)}; }
template <typename T> MG_FN float mg_to_float(T x);
template <> MG_FN float mg_to_float<bf16>(bf16 x) { return bits_float((uint32_t)x.bits << 16); }
template <typename T> MG_FN T mg_from_float(float x);
template <> MG_FN bf16 mg_from_float<bf16>(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return bf16{(uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}
"""


def compile_with(folder: Path, name: str, preludes, driver: str) -> Path:
    """The host vocabulary, then kernels_metal/preludes/<p> for p in `preludes`, then `driver` (a main), built
    with g++ into folder/name; skips where no C++ compiler exists."""
    if GXX is None:
        pytest.skip("no C++ compiler")
    src, exe = folder / f"{name}.cpp", folder / name
    src.write_text(PRELUDE + "".join(S._read(f"preludes/{p}") for p in preludes) + driver)
    r = subprocess.run([GXX, "-std=c++17", "-O1", str(src), "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:3000]
    return exe


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float values -> bf16 bits, rounded to nearest even (as the model's activations are stored)."""
    u = np.asarray(a).astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)


def bits_value(b: np.ndarray) -> np.ndarray:
    """bf16 bits -> their float32 values."""
    return (np.asarray(b).astype(np.uint32) << 16).view(np.float32)
