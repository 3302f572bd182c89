"""What each rank of the parallel tests runs: ``difforge.cli.main``, with two test-only hooks.

Read here only, never by difforge: ``DIFFORGE_TEST_FAIL_RANK=R`` makes rank R's URSA decode and
Qwen-Edit transformer call raise (a failing rank; ``DIFFORGE_TEST_FAIL_AFTER=N``: the first N URSA decodes
still succeed; ``DIFFORGE_TEST_FAIL_BLOCK=K``: the Qwen-Edit call raises in its K-th transformer block
instead, half-way through the call, after the earlier blocks' all-to-alls); ``DIFFORGE_TEST_LATENTS=PATH`` saves the final
Qwen-Edit latents of each run to ``PATH.rank<R>`` (so a test compares them with one process's);
``DIFFORGE_TEST_REFERENCE=PATH``: after a successful run, rank 0 runs the same edit once more on the
pipeline it loaded, as a one-process run (``--parallel none``: batched CFG, no group), and saves its
final latents to ``PATH`` - the single-process reference without a third model load;
``DIFFORGE_TEST_TOKENS=PATH`` saves the final URSA token ids of each run to ``PATH.rank<R>``;
``DIFFORGE_TEST_LOADS=PATH`` appends a line (device, dtype) to ``PATH.rank<R>`` for each pipeline the rank loads.
"""

from __future__ import annotations

import os


def _install_hooks() -> None:
    rank = os.environ.get("RANK", "0")
    if os.environ.get("DIFFORGE_TEST_FAIL_RANK") == rank:
        from difforge.models.qwen_edit import loop
        from difforge.models.ursa.pipeline import URSAPipeline

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError(f"injected failure on rank {rank}")

        def fail_after(method, spared: int):  # noqa: ANN001, ANN202 - the first ``spared`` calls still succeed
            left = [spared]

            def failing(self, *args: object, **kwargs: object) -> object:  # noqa: ANN001
                left[0] -= 1
                if left[0] < 0:
                    broken()
                return method(self, *args, **kwargs)

            return failing

        URSAPipeline.decode = fail_after(URSAPipeline.decode, int(os.environ.get("DIFFORGE_TEST_FAIL_AFTER", "0")))
        block = os.environ.get("DIFFORGE_TEST_FAIL_BLOCK")
        if block is None:
            loop.Denoiser._call = broken  # type: ignore[method-assign]
        else:
            from diffusers.models.transformers.transformer_qwenimage import QwenImageTransformerBlock

            QwenImageTransformerBlock.forward = fail_after(QwenImageTransformerBlock.forward, int(block))
    loads = os.environ.get("DIFFORGE_TEST_LOADS")
    if loads:
        from difforge import engine

        load_pipeline = engine.load_pipeline

        def counting(model, backend, dtype, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            with open(f"{loads}.rank{rank}", "a", encoding="utf-8") as f:
                f.write(f"{backend.device} {dtype}\n")
            return load_pipeline(model, backend, dtype, *args, **kwargs)

        engine.load_pipeline = counting
    tokens = os.environ.get("DIFFORGE_TEST_TOKENS")
    if tokens:
        import torch

        from difforge.models.ursa.pipeline import URSAPipeline

        ursa_decode = URSAPipeline.decode

        def saving_tokens(self, call, ids):  # noqa: ANN001, ANN202
            torch.save(ids.detach().cpu().clone(), f"{tokens}.rank{rank}")
            return ursa_decode(self, call, ids)

        URSAPipeline.decode = saving_tokens  # type: ignore[method-assign]
    latents = os.environ.get("DIFFORGE_TEST_LATENTS")
    if latents:
        import torch

        from difforge.models.qwen_edit.pipeline import QwenEditPipeline

        decode = QwenEditPipeline.decode

        def saving(self, lat, height, width):  # noqa: ANN001, ANN202
            target = os.environ.get("DIFFORGE_TEST_LATENTS")  # emptied for the reference run
            if target:
                torch.save(lat.detach().cpu().clone(), f"{target}.rank{rank}")
            return decode(self, lat, height, width)

        QwenEditPipeline.decode = saving  # type: ignore[method-assign]


def _reference(path: str) -> None:
    import dataclasses

    import torch

    from difforge import engine

    pipeline, cfg, images = _LOADED["pipeline"], _LOADED["cfg"], _LOADED["images"]
    seen: list[torch.Tensor] = []
    decode = type(pipeline).decode
    type(pipeline).decode = lambda self, lat, h, w: (seen.append(lat.detach().cpu().clone()), decode(self, lat, h, w))[1]
    os.environ["DIFFORGE_TEST_LATENTS"] = ""
    one = dataclasses.replace(cfg, parallel="none", output=None, record=None, perf_dump=None)
    engine.run_pipeline(pipeline, one, images=images)
    torch.save(seen[-1], path)


_LOADED: dict[str, object] = {}


def _remember_loads() -> None:
    from difforge import engine

    load, run = engine.load_pipeline, engine.run_pipeline

    def remembering_load(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        _LOADED["pipeline"] = load(*args, **kwargs)
        return _LOADED["pipeline"]

    def remembering_run(pipeline, cfg, images=None, **kwargs):  # noqa: ANN001, ANN003, ANN202
        _LOADED.update(cfg=cfg, images=images)
        return run(pipeline, cfg, images=images, **kwargs)

    engine.load_pipeline = remembering_load
    import difforge.api as api

    api.run_pipeline = remembering_run


if __name__ == "__main__":
    _install_hooks()
    reference = os.environ.get("DIFFORGE_TEST_REFERENCE")
    if reference:
        _remember_loads()
    from difforge.cli import main

    try:
        main()
    except SystemExit as done:
        if done.code not in (0, None):
            raise
    if reference and os.environ.get("RANK") == "0":
        _reference(reference)
