"""Host syncs in a loader's CUDA hot loop: ``torch.cuda.set_sync_debug_mode("warn")`` over an
epoch after 3 warm-up batches, uint8 and bfloat16 output, for each backend named.

    python -m benchmarks.gpu.gpu_sync /tmp/raw torch dali
"""
import sys
import warnings

import torch

import fastdata

for backend in sys.argv[2:]:
    for dtype in (torch.uint8, torch.bfloat16):
        loader = fastdata.Loader(sys.argv[1], backend=backend, batch_size=256, device="cuda",
                                 crop=224, num_workers=16, dtype=dtype)
        it = iter(loader)
        for _ in range(3):
            next(it)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            n = sum(1 for _ in it)
        torch.cuda.set_sync_debug_mode(0)
        msgs = sorted({str(x.message).splitlines()[0][:160] for x in w})
        print(f"{backend} {dtype}: {n} batches after 3 warm-up, {len(w)} sync warnings {msgs}")
