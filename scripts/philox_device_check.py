"""The portable Philox stream on an accelerator: same words as the CPU, same categorical draws, and their cost.

The one check a session with a device runs for issue 12 (no device was lent when this was written):

    python scripts/philox_device_check.py --device cuda [--json philox.json]      # or npu, xpu, mps

1. Random123 known answers computed on the device; 2. a 4 M-word grid, device vs CPU, bit for bit;
3. the default sampler, inverse-CDF over ``softmax`` of ``[rows, 64000]`` random logits, and
Gumbel-max over the same logits, device vs CPU (categories may differ only near a cumulative-sum
boundary, or where two scores are tied within float rounding; the counts are printed); 4. ms per
full-size draw of each (``--rows`` x 64000: 1024 rows = 512², 4096 = 1024²), eager and compiled by
the device's policy, against the reference stream's host ``exponential_`` + copy of the same size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial

import torch

from difforge.devices import get_backend
from difforge.models.ursa import DEVICE_CHUNK, HOST_CHUNK
from difforge.runtime.philox import (
    grid_words,
    gumbel_argmax,
    gumbel_argmax_block,
    inverse_cdf,
    inverse_cdf_logits_block,
    philox4x32,
)

KAT10 = [((0, 0, 0, 0), (0, 0), [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
         ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
         ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
          [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1])]


def _ms(fn, backend, reps: int = 3) -> float:  # type: ignore[no-untyped-def]
    fn()
    backend.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        backend.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best * 1000.0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--codes", type=int, default=64000)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    backend = get_backend(args.device)
    dev = backend.device
    chunk = HOST_CHUNK if backend.is_host else DEVICE_CHUNK  # the pipeline's eager blocks on this backend
    out: dict = {"device": str(dev), "device_name": backend.device_name(), "torch": torch.__version__,
                 "default_stream": backend.random_stream}
    out["kat"] = all(philox4x32(torch.tensor(c, device=dev), torch.tensor(k, device=dev)).cpu().tolist() == want
                     for c, k, want in KAT10)
    rows = torch.arange(1024)
    out["grid_equal"] = bool(torch.equal(grid_words(rows.to(dev), 4096, 7, 1, 12345, 678).cpu(),
                                         grid_words(rows, 4096, 7, 1, 12345, 678)))
    logits = torch.randn(args.rows, args.codes, generator=torch.Generator().manual_seed(0)) * 4
    on_dev = logits.to(dev)
    icdf_cpu = inverse_cdf(logits, 3, 1, 5, 0, logits=True)
    icdf_dev = inverse_cdf(on_dev, 3, 1, 5, 0, logits=True).cpu()
    out["inverse_cdf_rows_differing"] = int((icdf_cpu != icdf_dev).sum())
    out["inverse_cdf_ms_per_draw_eager"] = _ms(lambda: inverse_cdf(on_dev, 3, 1, 5, 0, logits=True), backend)
    icdf_compiled = backend.compile_policy().compile(partial(inverse_cdf_logits_block, inplace=False))
    if icdf_compiled is not None:
        words0 = [torch.full((), v, dtype=torch.int64, device=dev) for v in (3, 1, 5, 0)]
        fused0 = inverse_cdf(on_dev, *words0, block_fn=icdf_compiled, logits=True)
        out["inverse_cdf_compiled_rows_differing_from_eager"] = int((fused0.cpu() != icdf_dev).sum())
        out["inverse_cdf_ms_per_draw_compiled"] = _ms(
            lambda: inverse_cdf(on_dev, *words0, block_fn=icdf_compiled, logits=True), backend)
    cpu_codes = gumbel_argmax(logits, 3, 1, 5, 0)
    dev_codes = gumbel_argmax(on_dev, 3, 1, 5, 0, chunk=chunk).cpu()
    out["gumbel_rows_differing"] = int((cpu_codes != dev_codes).sum())
    out["ms_per_draw_eager"] = _ms(lambda: gumbel_argmax(on_dev, 3, 1, 5, 0, chunk=chunk), backend)
    compiled = backend.compile_policy().compile(partial(gumbel_argmax_block, inplace=False))
    if compiled is not None:
        words = [torch.full((), v, dtype=torch.int64, device=dev) for v in (3, 1, 5, 0)]
        fused = gumbel_argmax(on_dev, *words, chunk=DEVICE_CHUNK, block_fn=compiled)
        out["compiled_rows_differing_from_eager"] = int((fused.cpu() != dev_codes).sum())
        out["ms_per_draw_compiled"] = _ms(lambda: gumbel_argmax(on_dev, *words, chunk=DEVICE_CHUNK, block_fn=compiled),
                                          backend)
    gen = torch.Generator().manual_seed(0)
    host = torch.empty(args.rows, args.codes)
    out["ms_per_draw_reference_host"] = _ms(lambda: host.exponential_(generator=gen).to(dev), backend)
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0 if out["kat"] and out["grid_equal"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
