"""preludes/decode.h run on the CPU (g++); the GPU tests run the same functions inside the decode kernels.

The staging of a phase's input vector: a group's 256 threads emulated one after another (their writes are
disjoint), the RMSNorm's block sum done by the driver. Every element must be written once, rounded as the
kernel's old value-at-a-time loop rounded it, at the hidden and intermediate sizes of the dense shapes (896 to
18944: not all multiples of a pass's 4096 or 2048 values).

The attention splits' merge (mg_merge_splits): every value of a head from its splits' partials, each quad's four
lanes' shares folded as the device folds them after its lanes swap them, against float64, at split counts within,
at and past a lane's round trip.

A lane-group's rows two at a time (mg_wrow_pair, mg_rows_add_residual: o_proj and down into the residual): the
bits of the single-row dot in every lane, bf16 and 4-bit (and for 4-bit the gate/up pair's dot whose first round
trip was copied ahead, for bf16 the dot of a row copied into shared memory), and every row added once, in pairs or not alike."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from host_prelude import bf16_bits, bits_value, compile_with

DRIVER = r"""
template <int N>
int run(const std::vector<float>& h, const std::vector<uint16_t>& wbits, float eps, uint32_t short_by) {
  alignas(16) static bf16 xs[N];
  alignas(16) static float hv[N];
  alignas(16) static bf16 w[N];
  for (int i = 0; i < N; ++i) {
    xs[i].bits = 0x7FC1;  // a NaN no staging writes
    hv[i] = h[i];
    w[i].bits = wbits[i];
  }
  double ss = 0.0;
  for (uint32_t tid = 0; tid < 256; ++tid) ss += mg_stage_floats<bf16>(xs, hv, (uint32_t)N - short_by, tid);
  for (int i = 0; i < N; ++i) printf("%u ", (unsigned)xs[i].bits);
  printf("\n%.9g\n", ss);
  const float r = 1.0f / std::sqrt((float)ss / (float)N + eps);
  for (uint32_t tid = 0; tid < 256; ++tid) {
    const mg_norm_chunks<N> wv = mg_load_norm_weights<bf16, N>(w, tid);
    mg_norm_staged<bf16, N>(xs, wv, r, tid);
  }
  for (int i = 0; i < N; ++i) printf("%u ", (unsigned)xs[i].bits);
  printf("\n%.9g\n", r);
  return 0;
}
int main(int argc, char** argv) {
  // argv[1]: stage that many values fewer (the test that the checks see a value left out)
  const uint32_t short_by = argc > 1 ? (uint32_t)atoi(argv[1]) : 0u;
  int n;
  float eps;
  if (scanf("%d %f", &n, &eps) != 2) return 2;
  std::vector<float> h(n);
  std::vector<uint16_t> w(n);
  for (int i = 0; i < n; ++i) if (scanf("%f", &h[i]) != 1) return 2;
  for (int i = 0; i < n; ++i) {
    unsigned b;
    if (scanf("%u", &b) != 1) return 2;
    w[i] = (uint16_t)b;
  }
SIZES
  return 3;
}
"""

SIZES = [896, 1024, 1536, 2048, 2560, 3584, 4096, 4864, 5120, 18944]


@pytest.fixture(scope="module")
def staging(tmp_path_factory):
    sizes = "".join(f"  if (n == {n}) return run<{n}>(h, w, eps, short_by);\n" for n in SIZES)
    return compile_with(tmp_path_factory.mktemp("staging"), "staging", ["qdot.h", "decode.h"],
                        DRIVER.replace("SIZES", sizes))


def stage(exe, n, short_by=0):
    rng = np.random.default_rng()
    h = (rng.standard_normal(n) * np.exp(rng.uniform(-2, 2))).astype(np.float32)
    w = bf16_bits(rng.uniform(0.5, 1.5, n))
    text = f"{n} 1e-6\n" + " ".join(repr(float(v)) for v in h) + "\n" + " ".join(str(int(b)) for b in w) + "\n"
    r = subprocess.run([str(exe), str(short_by)], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    staged, ss, normed, rr = r.stdout.split("\n")[:4]
    return h, w, np.array(staged.split(), np.uint32), float(ss), np.array(normed.split(), np.uint32), np.float32(rr)


@pytest.mark.parametrize("n", SIZES)
def test_staged_rms_norm_writes_every_value_as_the_loop_did(staging, n):
    h, w, staged, ss, normed, r = stage(staging, n)
    # staging: every value, rounded to bf16 (none left at the NaN the driver fills xs with)
    assert np.array_equal(staged, bf16_bits(h))
    exact = float(np.sum(h.astype(np.float64) ** 2))
    assert abs(ss - exact) <= 1e-5 * exact
    # the norm: T(float(T(h)) * r * w), as the kernel's loop computed it, with the r the sums gave
    assert np.array_equal(normed, bf16_bits(bits_value(bf16_bits(h)) * r * bits_value(w)))


def test_a_value_left_out_is_caught(staging):
    h, _, staged, _, _, _ = stage(staging, 1024, short_by=4)
    assert not np.array_equal(staged, bf16_bits(h)) and np.all(staged[-4:] == 0x7FC1)


MERGE_DRIVER = r"""
template <int J>
void run(const std::vector<float>& pp, int ns) {
  // each quad's 4 lanes' shares, then each lane's fold of them in lane order, as mg_merge_splits does on the
  // device once the lanes have swapped their shares
  for (int c = 0; c < 128; c += 4) {
    mg_mshare sh[4];
    for (int q = 0; q < 4; ++q) sh[q] = mg_merge_share<128, J>(pp.data(), ns, c + q);
    for (int q = 0; q < 4; ++q) {
      printf("%.9g ", mg_merge_fold(sh[0].m, sh[1].m, sh[2].m, sh[3].m, sh[0].n[q], sh[1].n[q], sh[2].n[q], sh[3].n[q],
                                    sh[0].l, sh[1].l, sh[2].l, sh[3].l));
    }
  }
  printf("\n");
}

int main() {
  int ns, pad, j;
  if (scanf("%d %d %d", &ns, &pad, &j) != 3) return 2;
  // the splits' partials [ns + pad][MG_PS(128)]; the pad splits' max is 1e4 (past any split's: a read of one
  // past ns makes the result inf or NaN)
  const int ps = MG_PS(128);
  std::vector<float> pp((size_t)(ns + pad) * ps);
  for (size_t i = 0; i < pp.size(); ++i) {
    if (i < (size_t)ns * ps) {
      if (scanf("%f", &pp[i]) != 1) return 2;
    } else {
      pp[i] = i % ps == 128 ? 1e4f : 1.0f;
    }
  }
  if (j == 4) run<4>(pp, ns);
  else if (j == 5) run<5>(pp, ns);
  else return 3;
  return 0;
}
"""


@pytest.fixture(scope="module")
def merging(tmp_path_factory):
    return compile_with(tmp_path_factory.mktemp("merge"), "merge", ["qdot.h", "decode.h"], MERGE_DRIVER)


def merge(exe, parts, pad=3, j=5):
    """parts (ns, 130): a split's 128 values, its max, its sum; laid out as the kernels do (MG_PS: 2 words of
    padding a split, which hold garbage here: the merge must not read them)."""
    ns = parts.shape[0]
    rows = np.concatenate([parts, np.full((ns, 2), 7e30, np.float32)], 1)
    text = f"{ns} {pad} {j}\n" + " ".join(repr(float(v)) for v in rows.reshape(-1)) + "\n"
    r = subprocess.run([str(exe)], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return np.array(r.stdout.split(), np.float64)


# split counts within a lane's first round trip of J (4 J splits a trip), at it and past it, up to 33 (the most on
# 132 multiprocessors); J as the kernels take it (4 in the hybrid megakernels, 5 in the others)
@pytest.mark.parametrize("ns", [1, 3, 5, 8, 9, 16, 20, 21, 33])
@pytest.mark.parametrize("j", [4, 5])
def test_merge_splits_matches_float64(merging, ns, j):
    rng = np.random.default_rng()
    D = 128
    parts = np.zeros((ns, D + 2), np.float32)
    m = rng.uniform(-4, 12, ns).astype(np.float32)
    if ns > 4 * j:
        m[-1] = 15.0  # the largest max in a lane's second trip: its sums so far are rescaled
    if ns > 1:
        m[rng.integers(ns - 1)] = -np.inf  # a split with no positions: no max, no sum, no values
    parts[:, D] = m
    live = np.isfinite(m)
    parts[live, D + 1] = rng.uniform(1, 50, live.sum())
    parts[live, :D] = rng.standard_normal((live.sum(), D)) * parts[live, D + 1:D + 2]
    f = np.where(live, np.exp(m.astype(np.float64) - m[live].max()), 0.0)
    want = (f[:, None] * parts[:, :D].astype(np.float64)).sum(0) / (f * parts[:, D + 1]).sum()
    got = merge(merging, parts, j=j)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6 * np.abs(want).max())


@pytest.mark.parametrize("j", [4, 5])
def test_merge_splits_reads_no_split_past_the_count(merging, j):
    # the same partials merged with outsized splits after them and without: the same bits
    rng = np.random.default_rng()
    parts = np.concatenate([rng.standard_normal((9, 128)), rng.uniform(0, 3, (9, 1)), rng.uniform(1, 9, (9, 1))], 1)
    parts = parts.astype(np.float32)
    got = merge(merging, parts, pad=7, j=j)
    assert np.all(np.isfinite(got)) and np.array_equal(got, merge(merging, parts, pad=0, j=j))


ROWS_DRIVER = r"""
template <int QB>
int run(int K, int n, int nw, uint32_t spoil) {
  constexpr int GS = 64;
  const size_t words = (size_t)n * (size_t)K * (QB ? QB : 16) / 32;  // 32-bit words of the weight
  const size_t groups = QB ? (size_t)n * (size_t)K / GS : 1;
  std::vector<uint32_t> w(words);
  std::vector<bf16> s(groups), b(groups), x(K);
  std::vector<float> h0(n);
  for (size_t i = 0; i < words; ++i) if (scanf("%u", &w[i]) != 1) return 2;
  for (size_t i = 0; QB && i < groups; ++i) if (scanf("%hu", &s[i].bits) != 1) return 2;
  for (size_t i = 0; QB && i < groups; ++i) if (scanf("%hu", &b[i].bits) != 1) return 2;
  for (int i = 0; i < K; ++i) if (scanf("%hu", &x[i].bits) != 1) return 2;
  for (int i = 0; i < n; ++i) if (scanf("%f", &h0[i]) != 1) return 2;
  const bf16* wt = (const bf16*)w.data();
  // a pair's dots against the single-row dot's, every lane of neighbouring rows: bits that differ
  long differ = 0;
  for (int r = 0; r + 1 < n; r += 2) {
    for (uint32_t lane = 0; lane < 32; ++lane) {
      const mg_f2 p = mg_wrow_pair<bf16, QB, GS>(wt, s.data(), b.data(), r, r + 1, x.data(), K, lane);
      const float a = mg_wrow_dot<bf16, QB, GS>(wt, s.data(), b.data(), r, x.data(), K, lane);
      const float c = mg_wrow_dot<bf16, QB, GS>(wt, s.data(), b.data(), r + 1, x.data(), K, lane);
      differ += memcmp(&p.x, &a, 4) != 0;
      differ += memcmp(&p.y, &c, 4) != 0;
      if (QB == 4) {
        // the gate/up pair's dot with its first round trip copied ahead: the lane's chunks at k and k + 1024 as the
        // kernel copies them (none past K), then the same bits as the pair's dot
        const size_t KW = (size_t)K / 8u;
        const uint32_t* w1 = w.data() + (size_t)r * KW;
        const uint32_t* w2 = w1 + KW;
        const uint32_t k = lane * 32u;
        mg_u4 p0 = {}, q0 = {}, p1 = {}, q1 = {};
        if (k < (uint32_t)K) {
          p0 = MG_LOAD_U4_NC(w1 + k / 8u);
          q0 = MG_LOAD_U4_NC(w2 + k / 8u);
        }
        if (k + 1024u < (uint32_t)K) {
          p1 = MG_LOAD_U4_NC(w1 + (k + 1024u) / 8u);
          q1 = MG_LOAD_U4_NC(w2 + (k + 1024u) / 8u);
        }
        q1.y ^= spoil;  // (the test's own check: a wrong second chunk must show)
        const size_t g1 = (size_t)r * (K / GS);
        const size_t g2 = g1 + K / GS;
        const mg_f2 f = mg_q4_pair_dot_first<bf16, GS>(p0, q0, p1, q1, w1, s.data() + g1, b.data() + g1, w2,
                                                       s.data() + g2, b.data() + g2, x.data(), K, lane);
        differ += memcmp(&f.x, &p.x, 4) != 0;
        differ += memcmp(&f.y, &p.y, 4) != 0;
      } else {
        // the o_proj row copied into a group's slots as the kernel copies it (mg_copy_row_slots; here the thread of
        // lane-group 3), then the same bits as the row's dot
        const uint32_t tid = 96u + lane;
        const uint32_t nch = ((uint32_t)K + 255u) / 256u;
        std::vector<mg_u4> slots(nch * 256u);
        mg_copy_row_slots<bf16>(slots.data(), wt + (size_t)r * K, K, nch, lane, tid);
        if (K > 256) slots[256u + tid].y ^= spoil;  // (the test's own check: a wrong second chunk must show)
        const float o = mg_warp_dot_slots<bf16>(slots.data(), x.data(), K, lane, tid);
        differ += memcmp(&o, &a, 4) != 0;
        // and the gate/up pair (rows r, r + 1) copied the same way, up's chunks after gate's, against their pair's dot
        std::vector<mg_u4> pair(2u * nch * 256u);
        mg_copy_row_slots<bf16>(pair.data(), wt + (size_t)r * K, K, nch, lane, tid);
        mg_copy_row_slots<bf16>(pair.data() + 256u * nch, wt + (size_t)(r + 1) * K, K, nch, lane, tid);
        if (K > 256) pair[256u * (nch + 1u) + tid].y ^= spoil;
        const mg_f2 gu = mg_warp_dot2_slots<bf16>(pair.data(), pair.data() + 256u * nch, x.data(), K, lane, tid);
        const mg_f2 want = mg_wrow_dot2<bf16, 0, GS>(wt, s.data(), b.data(), r, wt, s.data(), b.data(), r + 1, x.data(), K,
                                                     lane);
        differ += memcmp(&gu.x, &want.x, 4) != 0;
        differ += memcmp(&gu.y, &want.y, 4) != 0;
      }
    }
  }
  printf("%ld\n", differ);
  // each row's dot, the lanes' parts summed in double
  for (int r = 0; r < n; ++r) {
    double t = 0.0;
    for (uint32_t lane = 0; lane < 32; ++lane) t += mg_wrow_dot<bf16, QB, GS>(wt, s.data(), b.data(), r, x.data(), K, lane);
    printf("%.9g ", t);
  }
  printf("\n");
  // the residual add over nw lane-groups (lane 0 writes: on the host its own part is its dot), in pairs, then not
  for (int pairs = 1; pairs >= 0; --pairs) {
    std::vector<float> h = h0;
    for (uint32_t gw = 0; gw < (uint32_t)nw; ++gw) {
      if (pairs) {
        mg_rows_add_residual<bf16, QB, GS, true>(wt, s.data(), b.data(), 0, x.data(), K, n, h.data(), gw, nw, 0u);
      } else {
        mg_rows_add_residual<bf16, QB, GS, false>(wt, s.data(), b.data(), 0, x.data(), K, n, h.data(), gw, nw, 0u);
      }
    }
    for (int r = 0; r < n; ++r) printf("%.9g ", h[r]);
    printf("\n");
  }
  return 0;
}
int main(int argc, char** argv) {
  // argv[1]: bits to flip in a lane's copied-ahead second chunk (the test that a wrong copy is seen)
  const uint32_t spoil = argc > 1 ? (uint32_t)strtoul(argv[1], nullptr, 10) : 0u;
  int qb, K, n, nw;
  if (scanf("%d %d %d %d", &qb, &K, &n, &nw) != 4) return 2;
  return qb == 4 ? run<4>(K, n, nw, spoil) : run<0>(K, n, nw, spoil);
}
"""


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return compile_with(tmp_path_factory.mktemp("rows"), "rows", ["qdot.h", "decode.h"], ROWS_DRIVER)


# (bits, K, rows, lane-groups): K with and without a whole 1024-value round trip and a tail (896: lanes 16-31 have
# only the tail), rows from under the lane-groups (no pair) to past twice them (pairs, then a single row)
ROW_CASES = [(0, 896, 40, 16), (0, 2560, 37, 12), (0, 4864, 9, 4), (0, 1024, 5, 8), (4, 896, 33, 10),
             (4, 2560, 26, 8), (4, 9728, 7, 3)]


@pytest.mark.parametrize("qb,K,n,nw", ROW_CASES)
def test_row_pairs_sum_as_single_rows(rows, qb, K, n, nw):
    """mg_wrow_pair gives each row the single-row dot's bits, every lane, and so does the 4-bit gate/up pair's dot with
    its first round trip copied ahead (mg_q4_pair_dot_first), and bf16 rows' dots from their chunks copied into a
    group's slots (mg_warp_dot_slots, o_proj's, and mg_warp_dot2_slots, a gate/up pair's, against mg_wrow_dot2);
    mg_rows_add_residual adds every row's dot
    to the residual once, rounded twice, in pairs or not alike; the dots against float64."""
    rng = np.random.default_rng()
    x = bf16_bits(rng.standard_normal(K))
    if qb:
        words = rng.integers(0, 2**32, (n, K // 8), dtype=np.uint64)
        s = bf16_bits(rng.uniform(0.005, 0.02, (n, K // 64)))
        b = bf16_bits(rng.uniform(-0.08, 0.0, (n, K // 64)))
        codes = ((words[:, :, None] >> (4 * np.arange(8, dtype=np.uint64))) & 0xF).reshape(n, K).astype(np.float64)
        wv = np.repeat(bits_value(s), 64, 1) * codes + np.repeat(bits_value(b), 64, 1)
        text = [" ".join(map(str, words.reshape(-1))), " ".join(map(str, s.reshape(-1))),
                " ".join(map(str, b.reshape(-1)))]
    else:
        wb = bf16_bits(rng.standard_normal((n, K)) * 0.05)
        wv = bits_value(wb).astype(np.float64)
        words = wb[:, 0::2].astype(np.uint64) | (wb[:, 1::2].astype(np.uint64) << 16)  # value 2i low in word i
        text = [" ".join(map(str, words.reshape(-1)))]
    h0 = rng.standard_normal(n).astype(np.float32)
    text = f"{qb} {K} {n} {nw}\n" + "\n".join(text + [" ".join(map(str, x)), " ".join(repr(float(v)) for v in h0)])
    r = subprocess.run([str(rows)], input=text + "\n", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    differ, dots, paired, single = r.stdout.split("\n")[:4]
    assert int(differ) == 0
    if K > (1024 if qb else 256):  # lanes with a second chunk: a wrong copy of it changes the copied row's bits
        spoiled = subprocess.run([str(rows), str(1 << 21)], input=text + "\n", capture_output=True, text=True,
                                 timeout=120)
        assert spoiled.returncode == 0 and int(spoiled.stdout.split("\n")[0]) > 0
    xv = bits_value(x).astype(np.float64)
    want = wv @ xv
    np.testing.assert_allclose(np.array(dots.split(), np.float64), want, rtol=0,
                               atol=1e-5 * np.abs(wv * xv).sum(1).max())
    paired = np.array(paired.split(), np.float32)
    assert np.array_equal(paired, np.array(single.split(), np.float32))
    # lane 0's part of each row (its 16-byte chunks: values 8 at a time, every 32nd chunk; 4-bit: 32 at a time)
    per = 32 if qb else 8
    part = (wv * xv * ((np.arange(K) // per) % 32 == 0)).sum(1)
    np.testing.assert_allclose(paired, h0 + part, rtol=0, atol=1.6e-2 * (np.abs(h0) + np.abs(part)).max())
    assert np.all(np.abs(paired - (h0 + part)) <= 1.6e-2 * (np.abs(h0) + np.abs(part)) + 1e-6)
