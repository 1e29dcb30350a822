"""preludes/qdot.h's quantized chunk arithmetic run on the CPU (g++), against float64 on fresh random codes
and activations: MLX affine 8-bit chunks and 4-bit chunks with their codes read in place (one row, and two
rows sharing one unpacked x). The GPU tests run the same functions inside the kernels; this pins their
arithmetic where CI can run it."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from kernels_metal import source as S

GXX = shutil.which("g++") or shutil.which("clang++")

# the prelude vocabulary qdot.h uses, for the host: T is bf16 held as its 16 bits
PRELUDE = r"""
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#define MG_FN inline
#define MG_DEVICE
#define MG_LOAD_U4(ptr) (*((const mg_u4*)(ptr)))
struct mg_u4 { uint32_t x, y, z, w; };
struct mg_f2 { float x, y; };
struct bf16 { uint16_t bits; };
static float bits_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
template <typename T> MG_FN mg_f2 mg_unpack2(uint32_t u);
template <> MG_FN mg_f2 mg_unpack2<bf16>(uint32_t u) { return {bits_float(u << 16), bits_float(u & 0xFFFF0000u)}; }
"""

DRIVER = r"""
int main() {
  // stdin: n chunks, each two rows' 4 words and 16 x words (32 bf16 values); stdout: per chunk
  // 4-bit (row 1: d, sx; row 2 sharing x: d1, d2, sx) and 8-bit (row 1's first 16 values: d, sx)
  int n;
  if (scanf("%d", &n) != 1) return 2;
  for (int c = 0; c < n; ++c) {
    mg_u4 w1, w2, x[4];
    if (scanf("%u %u %u %u %u %u %u %u", &w1.x, &w1.y, &w1.z, &w1.w, &w2.x, &w2.y, &w2.z, &w2.w) != 8) return 2;
    for (int i = 0; i < 4; ++i)
      if (scanf("%u %u %u %u", &x[i].x, &x[i].y, &x[i].z, &x[i].w) != 4) return 2;
    const mg_f2 a = mg_qdot_chunk<bf16, 4>(w1, x[0], x[1], x[2], x[3]);
    const mg_q4_sums b = mg_q4_chunk_inplace<bf16, true>(w1, w2, x[0], x[1], x[2], x[3]);
    const mg_f2 e = mg_qdot_chunk<bf16, 8>(w1, x[0], x[1], x[0], x[1]);
    printf("%.9g %.9g %.9g %.9g %.9g %.9g %.9g\n", a.x, a.y, b.d1, b.d2, b.sx, e.x, e.y);
  }
  return 0;
}
"""


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, rounded to nearest even (as the model's activations are stored)."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)


def bits_value(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@pytest.fixture(scope="module")
def qdot_program(tmp_path_factory):
    if GXX is None:
        pytest.skip("no C++ compiler")
    folder = tmp_path_factory.mktemp("qdot")
    src, exe = folder / "qdot.cpp", folder / "qdot"
    src.write_text(PRELUDE + S._read("preludes/qdot.h") + DRIVER)
    r = subprocess.run([GXX, "-std=c++17", "-O1", str(src), "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:3000]
    return exe


def run(exe, words, xbits):
    lines = [str(len(words))]
    for w, x in zip(words, xbits):
        xw = x[0::2] | (x[1::2] << 16)  # value 2i in the low half of word i
        lines.append(" ".join(str(int(v)) for v in list(w) + list(xw)))
    r = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return np.array([[float(v) for v in line.split()] for line in r.stdout.split("\n") if line])


def codes4(words):
    # value 8j + i of a chunk is nibble i of word j (MLX packs the low bits first)
    return np.array([[(int(w) >> (4 * i)) & 0xF for w in row for i in range(8)] for row in words], np.float64)


def codes8(words):
    return np.array([[(int(w) >> (8 * i)) & 0xFF for w in row for i in range(4)] for row in words], np.float64)


def test_quantized_chunks_against_float64(qdot_program):
    rng = np.random.default_rng()
    n = 200
    words = rng.integers(0, 2**32, size=(n, 8), dtype=np.uint64)
    # activations over several magnitudes, as a normed hidden state's are
    x = rng.standard_normal((n, 32)) * np.exp(rng.uniform(-3, 3, size=(n, 1)))
    xbits = bf16_bits(x)
    xv = bits_value(xbits)
    out = run(qdot_program, words, xbits)
    q1, q2 = codes4(words[:, :4]), codes4(words[:, 4:])
    scale = np.abs(xv).sum(axis=1) * 15
    sx = xv.sum(axis=1)
    assert np.max(np.abs(out[:, 0] - (xv * q1).sum(axis=1)) / scale) < 2e-6
    assert np.max(np.abs(out[:, 1] - sx) / np.abs(xv).sum(axis=1)) < 2e-6
    # the in-place pair: both rows against the one x
    assert np.max(np.abs(out[:, 2] - (xv * q1).sum(axis=1)) / scale) < 2e-6
    assert np.max(np.abs(out[:, 3] - (xv * q2).sum(axis=1)) / scale) < 2e-6
    assert np.max(np.abs(out[:, 4] - sx) / np.abs(xv).sum(axis=1)) < 2e-6
    # 8 bits: 16 values of x against the chunk's 16 codes
    q8 = codes8(words[:, :4])
    x16 = xv[:, :16]
    assert np.max(np.abs(out[:, 5] - (x16 * q8).sum(axis=1)) / (np.abs(x16).sum(axis=1) * 255)) < 2e-6
    assert np.max(np.abs(out[:, 6] - x16.sum(axis=1)) / np.abs(x16).sum(axis=1)) < 2e-6


def test_a_misread_code_is_caught(qdot_program):
    # the check above would see one code read from the wrong position: swap two nibbles of one word
    rng = np.random.default_rng()
    words = rng.integers(0, 2**32, size=(1, 8), dtype=np.uint64)
    words[0, 0] = 0x0000000F  # code 0 is 15, code 1 is 0
    x = np.zeros((1, 32))
    x[0, 0], x[0, 1] = 1.0, -1.0
    out = run(qdot_program, words, bf16_bits(x))
    assert out[0, 0] == 15.0 and out[0, 2] == 15.0 and out[0, 1] == 0.0
