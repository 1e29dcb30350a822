"""Magpie's fused LT draw chain (kernels_metal.magpie_lt_draws) beside its reference and the eager MLX path:
correctness at temperature 0 (codes identical over many random h), the sampled draws (the same hash as the
reference; top-k respected, forbidden ids never drawn, draw 0's distribution), and ms per 16-draw chain,
kernel against the eager loop (StepGraph.draw's: Model.local_step + the fused sampler per code), bf16 and
fp32, on the 357M shapes with random weights.

    PYTHONPATH=.:tests python3 benchmarks/magpie_lt_check.py [--chains 200] [--log out.log]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("MLX_ENABLE_TF32", "0")  # float32 matmuls in float32 (the comparisons need it)

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

import kernels_metal as K  # noqa: E402
from kernels_metal import gpu as G  # noqa: E402
from kernels_metal import reference as ref  # noqa: E402
from metalgen.magpie import dummy  # noqa: E402
from metalgen.magpie.frames import eager_draws  # noqa: E402
from metalgen.magpie.lt_kernel import pack_lt  # noqa: E402
from metalgen.sampling import make_sampler  # noqa: E402

LOG = []


def say(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


def eager_chain(model, h, bad, cfg_scale, sampler):
    """StepGraph.draw's loop (frames.eager_draws) with a DeviceSampler."""
    return eager_draws(model, h, bad, cfg_scale, lambda logits: sampler(logits)[0])


def teacher_logits(model, h, codes, bad, cfg_scale):
    """The CFG-combined, masked logits (n, V) of each draw given the codes before it (teacher-forced)."""
    a = model.args
    C, S, V = a.num_codebooks, a.frame_stacking_factor, a.num_tokens_per_codebook
    c = mx.broadcast_to(codes.reshape(S, C).T[None], (h.shape[0], C, S))  # (rows, C, S): frame i, codebook c
    lg = model.local_transformer_logits(h[:, None, :], c).reshape(h.shape[0], C * S, V)
    lg = cfg_scale * lg[0] + (1.0 - cfg_scale) * lg[1] if h.shape[0] > 1 else lg[0]
    return lg.astype(mx.float32) + bad


def timeit(fn, state, iters):
    """ms a call, calls chained through the state and queued (one eval at the end), after a warm-up."""
    for _ in range(3):
        out, state = fn(state)
    mx.eval(out, state)
    t = time.perf_counter()
    for _ in range(iters):
        out, state = fn(state)
    mx.eval(out, state)
    return (time.perf_counter() - t) * 1e3 / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chains", type=int, default=200)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--log", default=None)
    args = ap.parse_args()
    G.MAGPIE_LT_STRICT = True  # a build failure must show, not fall back
    K.set_verbose(True)
    say(f"# magpie_lt_check  backend={K.backend()}  device={mx.device_info().get('device_name', '?')}  "
        f"sms={G.multiprocessors()}  mlx={mx.__version__}  TF32={os.environ.get('MLX_ENABLE_TF32')}")
    model = dummy.lt_check_model()
    a = model.args
    V, d, n = a.num_tokens_per_codebook, a.decoder.d_model, a.num_codebooks * a.frame_stacking_factor
    cfg = 2.5
    rng = np.random.default_rng(1)
    # the frame loop's mask: the specials (ids >= codebook_size) forbidden, EOS allowed
    badn = np.zeros(V, np.float32)
    badn[a.codebook_size:] = -np.inf
    badn[a.audio_eos_id] = 0.0
    bad = mx.array(badn)
    results = {}
    for dtype in (mx.float32, mx.bfloat16):
        dn = "fp32" if dtype == mx.float32 else "bf16"
        if dtype == mx.bfloat16:
            model.set_dtype(mx.bfloat16)
            mx.eval(model.parameters())
        t0 = time.perf_counter()
        packed = pack_lt(model)
        w = packed.weights
        say(f"\n## {dn}: weights {sum(x.nbytes for x in w if isinstance(x, mx.array)) / 1e6:.1f} MB packed "
            f"({time.perf_counter() - t0:.2f} s)")
        # 1. greedy: kernel vs reference (same packed weights, float32 math) and vs the eager model loop
        t0 = time.perf_counter()
        same_ref = same_eager = 0
        first_diff = []
        for i in range(args.chains):
            h = mx.array(rng.standard_normal((2, d)).astype(np.float32)).astype(dtype)
            st = K.make_sample_state(i)
            kc, ks = K.magpie_lt_draws(h, w, bad, cfg, 0.0, 80, st, packed.scratch)
            rc, rs = ref.magpie_lt_draws(h, w, bad, cfg, 0.0, 80, st)
            kc, rc = np.array(kc), np.array(rc)
            if i == 0:
                assert np.array_equal(np.array(ks), np.array(rs)), (np.array(ks), np.array(rs))
            if np.array_equal(kc, rc):
                same_ref += 1
            else:
                first_diff.append(int(np.argmax(kc != rc)))
            if i < 20:
                ec = np.array(eager_chain(model, h, bad, cfg, make_sampler(0.0, 80, seed=i)))
                same_eager += int(np.array_equal(kc, ec))
        say(f"greedy: {same_ref}/{args.chains} chains identical to the reference "
            f"(first differing draw of the others: {sorted(first_diff)[:20]}); "
            f"{same_eager}/{min(20, args.chains)} identical to the eager model loop ({dn} MLX ops)  "
            f"[{time.perf_counter() - t0:.1f} s]")
        results[(dn, "greedy")] = (same_ref, args.chains)
        # 2. sampled (T 0.7, top-k 80): the same hash as the reference, so the same codes but for float near-ties;
        # every code among the top 80 of its teacher-forced logits and never a forbidden id
        t0 = time.perf_counter()
        same = topk_bad = forbidden = 0
        nchk = max(20, args.chains // 4)
        for i in range(nchk):
            h = mx.array(rng.standard_normal((2, d)).astype(np.float32)).astype(dtype)
            st = K.make_sample_state(10_000 + i)
            kc, _ = K.magpie_lt_draws(h, w, bad, cfg, 0.7, 80, st, packed.scratch)
            rc, _ = ref.magpie_lt_draws(h, w, bad, cfg, 0.7, 80, st)
            same += int(np.array_equal(np.array(kc), np.array(rc)))
            tl = np.array(teacher_logits(model, h.astype(mx.float32), kc, bad, cfg))  # (n, V)
            kcn = np.array(kc)
            for j in range(n):
                kth = np.sort(tl[j])[V - 80]
                # tolerance for the rounding between the kernel's and MLX's logits
                topk_bad += int(tl[j, kcn[j]] < kth - 1e-3 * max(1.0, abs(kth)))
                forbidden += int(np.isinf(badn[kcn[j]]))
        say(f"sampled T=0.7 top-k 80: {same}/{nchk} chains identical to the reference; draws outside the top 80: "
            f"{topk_bad}/{nchk * n}; forbidden ids drawn: {forbidden}  [{time.perf_counter() - t0:.1f} s]")
        results[(dn, "sampled")] = (same, nchk, topk_bad, forbidden)
        # 3. draw 0's distribution over seeds for one h against softmax(top-80(l0 / T))
        h = mx.array(rng.standard_normal((2, d)).astype(np.float32)).astype(dtype)
        counts = np.zeros(V)
        st = K.make_sample_state(77)
        for _ in range(args.samples):
            kc, st = K.magpie_lt_draws(h, w, bad, cfg, 0.7, 80, st, packed.scratch)
            counts[int(np.array(kc)[0])] += 1
        l0 = np.array(teacher_logits(model, h.astype(mx.float32), mx.zeros((n,), mx.int32), bad, cfg))[0] / 0.7
        kth = np.sort(l0)[V - 80]
        p = np.where(l0 >= kth, np.exp(l0 - l0.max()), 0.0)
        p /= p.sum()
        tv = 0.5 * np.abs(counts / counts.sum() - p).sum()
        # the total variation of an exact sampler's histogram of N draws over ~80 outcomes is ~0.5 * sum
        # sqrt(2 p (1 - p) / (pi N)); report both
        tv_exp = 0.5 * np.sum(np.sqrt(2 * p * (1 - p) / (np.pi * args.samples)))
        say(f"draw 0 over {args.samples} seeds: total variation to softmax(top-80) {tv:.4f} (sampling noise "
            f"~{tv_exp:.4f}); outside the top 80: {int(counts[l0 < kth].sum())}")
        results[(dn, "tv")] = (tv, tv_exp)
        # 4. timing: ms per 16-draw chain, kernel (grid sweep) vs the eager loop
        h = mx.array(rng.standard_normal((2, d)).astype(np.float32)).astype(dtype)
        sms = G.multiprocessors() or 16
        for per_sm in (1, 2):
            G.MAGPIE_LT_GROUPS = sms * per_sm
            ms = timeit(lambda s: K.magpie_lt_draws(h, w, bad, cfg, 0.7, 80, s, packed.scratch),
                        K.make_sample_state(5), args.iters)
            msg = timeit(lambda s: K.magpie_lt_draws(h, w, bad, cfg, 0.0, 80, s, packed.scratch),
                         K.make_sample_state(5), args.iters)
            say(f"kernel {G.MAGPIE_LT_GROUPS} groups ({per_sm}/SM): {ms:.3f} ms a chain sampled, {msg:.3f} greedy")
            results[(dn, f"kernel{per_sm}")] = ms
        G.MAGPIE_LT_GROUPS = None
        sampler = make_sampler(0.7, 80, seed=5)

        def eager(s):
            return eager_chain(model, h, bad, cfg, sampler), s

        me = timeit(eager, mx.zeros((1,)), max(10, args.iters // 10))
        say(f"eager MLX loop: {me:.3f} ms a chain")
        results[(dn, "eager")] = me
        # single-chain latency, synchronized each call
        t = time.perf_counter()
        st = K.make_sample_state(9)
        for _ in range(50):
            kc, st = K.magpie_lt_draws(h, w, bad, cfg, 0.7, 80, st, packed.scratch)
            mx.eval(kc, st)
        say(f"kernel, evaluated every call: {(time.perf_counter() - t) * 1e3 / 50:.3f} ms a chain")
    say("\n# summary")
    for k, v in results.items():
        say(f"{k}: {v}")
    if args.log:
        with open(args.log, "w") as f:
            f.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    sys.exit(main())
