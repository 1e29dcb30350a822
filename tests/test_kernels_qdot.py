"""preludes/qdot.h's quantized chunk arithmetic run on the CPU (g++), against float64 on fresh random codes
and activations: MLX affine 8-bit chunks and 4-bit chunks with their codes read in place (one row, and two
rows sharing one unpacked x), a chunk's sum of x made apart, and two rows' 4-bit chunks against x in 16-bit fixed
point as integer pair dots (exactly, against numpy's integers). The GPU tests run the same functions inside the
kernels; this pins their arithmetic where CI can run it."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from host_prelude import bf16_bits, bits_value, compile_with

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
    // the chunk's sum of x alone (mg_chunk_sums), and the pair's sums without it
    const float xsum = mg_q4_chunk_xsum<bf16>(x[0], x[1], x[2], x[3]);
    const mg_q4_sums f = mg_q4_chunk_inplace<bf16, true, false>(w1, w2, x[0], x[1], x[2], x[3]);
    // the x words read as 16-bit fixed point instead (mg_chunk_fix's layout): the pair's integer sums
    const mg_q4_isums g = mg_q4_chunk_fixed<true>(w1, w2, x[0], x[1], x[2], x[3]);
    printf("%.9g %.9g %.9g %.9g %.9g %.9g %.9g %.9g %.9g %.9g %d %d\n", a.x, a.y, b.d1, b.d2, b.sx, e.x, e.y, xsum,
           f.d1, f.d2, g.d1, g.d2);
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def qdot_program(tmp_path_factory):
    return compile_with(tmp_path_factory.mktemp("qdot"), "qdot", ["qdot.h"], DRIVER)


def run(exe, words, xbits, packed=False):
    """The driver's columns for each chunk: code words `words`, x as bf16 bits (or, packed, as its 16 words)."""
    lines = [str(len(words))]
    for w, x in zip(words, xbits):
        xw = x if packed else x[0::2] | (x[1::2] << 16)  # value 2i in the low half of word i
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
    xv = bits_value(xbits).astype(np.float64)
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
    # the sum of x made apart (once a vector) has the bits of the one made with the codes, and the codes' sums
    # are the same without it (%.9g tells float32 values apart)
    assert np.array_equal(out[:, 7], out[:, 4])
    assert np.array_equal(out[:, 8:10], out[:, 2:4])


def test_a_misread_code_is_caught(qdot_program):
    # the check above would see one code read from the wrong position: swap two nibbles of one word
    rng = np.random.default_rng()
    words = rng.integers(0, 2**32, size=(1, 8), dtype=np.uint64)
    words[0, 0] = 0x0000000F  # code 0 is 15, code 1 is 0
    x = np.zeros((1, 32))
    x[0, 0], x[0, 1] = 1.0, -1.0
    out = run(qdot_program, words, bf16_bits(x))
    assert out[0, 0] == 15.0 and out[0, 2] == 15.0 and out[0, 1] == 0.0


def fixed_point(xv):
    """A chunk of x (float64 rows of 32 bf16 values) as mg_chunk_fix makes it: X = x 2^(15 - E) rounded to the
    nearest (even) integer, 2^E the power of two just above the chunk's largest |x|; (X, scale 2^(E - 15))."""
    m = np.abs(xv).max(axis=1, keepdims=True)
    e = np.floor(np.log2(m)) + 1  # 2^(E - 1) <= m < 2^E
    return np.rint(xv * 2.0 ** (15 - e)).astype(np.int64), 2.0 ** (e - 15)


def fixed_words(X):
    """X (rows of 32 int16 values) in mg_chunk_fix's words: 8 values a 16-byte word as (X0, X2), (X4, X6), (X1, X3),
    (X5, X7)."""
    u = (X & 0xFFFF).astype(np.uint64)
    out = []
    for j in range(4):
        v = u[:, 8 * j:8 * j + 8]
        out += [v[:, a] | (v[:, b] << 16) for a, b in ((0, 2), (4, 6), (1, 3), (5, 7))]
    return np.stack(out, axis=1)


def test_fixed_point_chunks_are_exact_integer_dots(qdot_program):
    # the 4-bit rows' dots with x in 16-bit fixed point (decode_layer.body's QFX): each row's sum of q X exactly,
    # and, scaled, within half a unit of X a code of the float64 dot
    rng = np.random.default_rng()
    n = 300
    words = rng.integers(0, 2**32, size=(n, 8), dtype=np.uint64)
    x = rng.standard_normal((n, 32)) * np.exp(rng.uniform(-6, 6, size=(n, 1)))
    x[::5, :16] *= 1e-3  # chunks whose values span many powers of two
    xv = bits_value(bf16_bits(x)).astype(np.float64)
    X, scale = fixed_point(xv)
    assert np.abs(X).max() < 2**15
    out = run(qdot_program, words, fixed_words(X), packed=True)[:, 10:12].astype(np.int64)
    q1, q2 = codes4(words[:, :4]).astype(np.int64), codes4(words[:, 4:]).astype(np.int64)
    assert np.array_equal(out[:, 0], (q1 * X).sum(axis=1))
    assert np.array_equal(out[:, 1], (q2 * X).sum(axis=1))
    # each X is off by at most half a unit: the scaled sum by at most half the scale a unit of code
    bound = 0.5 * scale[:, 0] * q1.sum(axis=1)
    assert np.all(np.abs(out[:, 0] * scale[:, 0] - (q1 * xv).sum(axis=1)) <= bound)


def test_a_misplaced_fixed_point_pair_is_caught(qdot_program):
    # value 1 of a word where value 2 belongs (the pairs are (X0, X2), ...): the integer check above would see it
    words = np.zeros((1, 8), dtype=np.uint64)
    words[0, 0] = 0x00000F00  # code 2 is 15, the others 0
    X = np.zeros((1, 32), np.int64)
    X[0, 1], X[0, 2] = 7, 3
    assert run(qdot_program, words, fixed_words(X), packed=True)[0, 10] == 15 * 3
