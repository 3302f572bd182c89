"""One process's regional compile of a tiny-ursa-shaped decoder layer; prints its compile seconds as JSON.

Run twice with the same ``DIFFORGE_HOME`` by ``benchmarks/bench_compile_cache.py`` (the time ratio) and by
``tests/devices/test_compile_cache.py`` (the cache hits): the second process finds the first one's graphs and
kernels on disk.  The compile's cost is the first two compiled forwards less two
steady ones (the first call compiles; the second may still finish guards and caches).
"""

from __future__ import annotations

import json
import time

import torch

from difforge.devices import get_backend
from difforge.models.ursa import URSATransformer, URSATransformerConfig, positions, run_layer
from difforge.ops import select_ops
from difforge.runtime.hashes import difforge_home

TEXT, LATENT = 64, (1, 8, 8)  # tiny-ursa's transformer at 128x128, a short prompt


def main() -> None:
    from difforge.devices.compile import use_compile_caches

    caches = use_compile_caches(difforge_home())
    torch.manual_seed(0)
    cfg = URSATransformerConfig(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                                num_hidden_layers=2, max_window_layers=2, vocab_size=1024 + 256, lm_vocab_size=1024,
                                lm_head_size=256, bov_token_id=1000)
    backend = get_backend("cpu")
    model = URSATransformer(cfg).eval().requires_grad_(False)
    model.set_ops(select_ops(backend))
    ids = torch.randint(0, 1000, (2, TEXT + 1 + LATENT[1] * LATENT[2]))
    pos = positions(LATENT, TEXT)
    model.set_layer_fn(backend.compile_policy().compile(run_layer))
    times = []
    with torch.no_grad():
        for _ in range(4):
            t0 = time.perf_counter()
            model(ids, pos)
            times.append(time.perf_counter() - t0)
    steady = min(times[2:])
    from torch._dynamo.utils import counters

    graphs = {k: int(v) for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
    print(json.dumps({"compile_s": times[0] + times[1] - 2 * steady, "calls_s": times, "folders": caches.folders,
                      "fxgraph_cache": graphs}))


if __name__ == "__main__":
    main()
