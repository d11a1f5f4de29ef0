#!/usr/bin/env python3
"""PyTorch CPU peer of bench_amp's unscale + non-finite check.

torch 1.13 has no CPU kernel for _amp_foreach_non_finite_check_and_unscale_
(only CUDA); its CPU equivalent, as later PyTorch versions implement it, is
a non-finite check and an in-place multiply per tensor.  Rates count the
same bytes as bench_amp (read + written once: 2 x nbytes), so the numbers
compare the work done, not the passes taken.  One thread, like bench_amp.

    /opt/tutti-venv/bin/python bench/amp/torch_peer.py
"""
import time

import torch

torch.set_num_threads(1)


def rate(fn, nbytes, min_time=0.3):
    fn()
    iters, start = 0, time.process_time()
    while True:
        fn()
        iters += 1
        elapsed = time.process_time() - start
        if elapsed >= min_time:
            return nbytes * iters / elapsed / 2**30


def main():
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for n in (1 << 16, 1 << 20, 1 << 25):
            t = (torch.rand(n) * 200 - 100).to(dtype)
            inv = [0.5, 2.0]
            k = [0]

            def step():
                found = not bool(torch.isfinite(t).all())
                t.mul_(inv[k[0] & 1])
                k[0] += 1
                return found

            nbytes = 2 * t.numel() * t.element_size()
            print(f"torch unscale+check {str(dtype):15s} n={n:9d}: "
                  f"{rate(step, nbytes):7.2f} GiB/s")
    for n in (1 << 16, 1 << 20, 1 << 25):
        a, b = torch.rand(n), torch.empty(n)
        print(f"torch copy_ float32 n={n:9d}: "
              f"{rate(lambda: b.copy_(a), 2 * a.numel() * 4):7.2f} GiB/s")


if __name__ == "__main__":
    main()
