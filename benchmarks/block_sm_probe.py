"""Which multiprocessor each group of a 264-group launch runs on (as the megakernel launches them: 256 threads, ~43 KB
of shared memory, two a multiprocessor on the H200): the groups' SM ids, and how many distinct multiprocessors the
first k groups cover, for the phases whose rows sit on the first groups (down's on qwen2.5-0.5b: groups 0-111).

    PYTHONPATH=. python3 benchmarks/block_sm_probe.py [--groups 264] [--smem 43000]
"""

import argparse

import mlx.core as mx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=264)
    ap.add_argument("--smem", type=int, default=43000)
    args = ap.parse_args()
    src = f"""
  __shared__ volatile char pad[{args.smem}];
  pad[threadIdx.x] = (char)threadIdx.x;
  unsigned int s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = s + (unsigned int)pad[0] * 0u + (unsigned int)x[0] * 0u;
"""
    kern = mx.fast.cuda_kernel(name="block_sm_probe", input_names=["x"], output_names=["out"], source=src)
    for run in range(3):
        (out,) = kern(inputs=[mx.zeros((1,), mx.uint32)], grid=(args.groups * 256, 1, 1), threadgroup=(256, 1, 1),
                      output_shapes=[(args.groups,)], output_dtypes=[mx.uint32])
        sm = out.tolist()
        print(f"run {run}: groups 0-15 on {sm[:16]}; 132-147 on {sm[132:148]}")
        for k in (112, 128, 132, 136, 152, 264):
            first = sm[:k]
            twice = sorted(g for g in range(k) if first.count(first[g]) > 1)
            print(f"  groups 0..{k - 1}: {len(set(first))} multiprocessors, groups sharing one: {twice}; "
                  f"the last {k}: {len(set(sm[-k:]))}")
        if run == 0:
            print("  every group's multiprocessor:", sm)


if __name__ == "__main__":
    main()
