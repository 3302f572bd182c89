"""The CUDA backend's policy for the Triton kernels: where they are offered, the switch, what select_ops binds
and records.  The GPU itself is stood in for by patching ``CUDABackend.triton_usable``; the kernels run
under the interpreter (see conftest.py)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from difforge.devices import CPUBackend, CUDABackend
from difforge.devices.cuda import TRITON_ENV, TRITON_OPS, TritonKernel, triton_ops_asked
from difforge.errors import InputError
from difforge.ops import rotary, select_ops
from difforge.runtime.record import RunRecord


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA backend that finds an NVIDIA GPU and triton."""
    monkeypatch.setattr(CUDABackend, "triton_usable", staticmethod(lambda: True))
    monkeypatch.delenv(TRITON_ENV, raising=False)


def test_offered_for_the_elementwise_ops_and_the_sampler_only(gpu: None) -> None:
    backend = CUDABackend()
    assert {op: backend.fused_kernel(op) for op in TRITON_OPS} == {op: TritonKernel(op) for op in TRITON_OPS}
    assert backend.fused_kernel("attention") is None  # SDPA's own kernels


def test_never_without_a_usable_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CUDABackend, "triton_usable", staticmethod(lambda: False))
    monkeypatch.setenv(TRITON_ENV, "on")
    assert all(CUDABackend().fused_kernel(op) is None for op in TRITON_OPS)
    assert all(CPUBackend().fused_kernel(op) is None for op in TRITON_OPS)
    assert select_ops(CPUBackend()).names()["rms_norm"].startswith("torch")


@pytest.mark.parametrize(("value", "kept"), [
    (None, set(TRITON_OPS)), ("on", set(TRITON_OPS)), ("1", set(TRITON_OPS)),
    ("off", set()), ("0", set()), ("rotary, swiglu", {"rotary", "swiglu"}), ("RMS_NORM", {"rms_norm"}),
])
def test_switch_values(gpu: None, monkeypatch: pytest.MonkeyPatch, value: str | None, kept: set[str]) -> None:
    if value is not None:
        monkeypatch.setenv(TRITON_ENV, value)
    assert triton_ops_asked(value) == kept
    assert {op for op in TRITON_OPS if CUDABackend().fused_kernel(op) is not None} == kept


def test_a_misspelt_switch_is_one_input_error(gpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRITON_ENV, "rotary,swigloo")
    with pytest.raises(InputError, match="swigloo") as info:
        CUDABackend().fused_kernel("rotary")
    assert "\n" not in str(info.value)


def test_the_switch_is_a_recorded_variable() -> None:
    assert TRITON_ENV in CUDABackend().env_var_names()


def test_select_ops_binds_the_kernels_and_records_their_exactness(gpu: None, tk: ModuleType) -> None:
    ops = select_ops(CUDABackend())
    assert ops.rms_norm is tk.rms_norm and ops.swiglu is tk.swiglu and ops.rotary is tk.apply_rotary
    assert ops.swiglu_packed is None  # a packed gate/up GEMM would change the products
    assert ops.rope_table is rotary.rope_table
    record = RunRecord("generate")
    ops.record_to(record)
    chosen = {a.what: a for a in record.adaptations}
    assert chosen["rotary"].choice == "triton rotary" and chosen["rotary"].exact
    assert chosen["swiglu"].choice == "triton swiglu" and chosen["swiglu"].exact
    assert chosen["rms_norm"].choice == "triton rms_norm" and not chosen["rms_norm"].exact
    assert chosen["sampler"].choice == "triton philox inverse-cdf" and not chosen["sampler"].exact
    assert chosen["rate"].choice == "triton metric rate" and not chosen["rate"].exact
    x = torch.randn(1, 4, 2, 8, generator=torch.Generator().manual_seed(0))
    table = ops.rope_table(torch.ones(4, 4) * 0.5, torch.ones(4, 4) * 0.25)
    assert torch.equal(ops.rotary(x, table), rotary.apply_rotary(x, table))


def test_switched_off_ops_stay_plain_and_overrides_still_win(
    gpu: None, tk: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRITON_ENV, "rotary")
    ops = select_ops(CUDABackend(), {"swiglu": lambda g, u: g})
    assert ops.names()["rotary"] == "triton rotary"
    assert ops.names()["rms_norm"].startswith("torch") and ops.names()["swiglu"].startswith("override:")
    assert "sampler" not in ops.names() and "rate" not in ops.names()  # switched off: the torch draws and rates


def test_a_transformer_forward_runs_every_kernel(gpu: None, tk: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ops are bound to a real (small) URSA transformer: each kernel path runs - not its plain fallback,
    which a shape it does not index would take silently - and the output is the plain forward's."""
    from difforge.models.ursa import URSATransformer, URSATransformerConfig
    from difforge.models.ursa.rope import positions

    cfg = URSATransformerConfig(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
        vocab_size=100 + 16, lm_vocab_size=100, lm_head_size=16, bov_token_id=90,
    )
    torch.manual_seed(0)
    plain, fused = URSATransformer(cfg).eval(), URSATransformer(cfg).eval()
    fused.load_state_dict(plain.state_dict())
    launches: list[str] = []
    for name in ("_rms_norm_kernel", "_swiglu_kernel", "_rotary_kernel"):
        kernel = getattr(tk, name)

        class Spy:
            def __init__(self, kernel: object, name: str) -> None:
                self.kernel, self.name = kernel, name

            def __getitem__(self, grid: object):  # type: ignore[no-untyped-def]
                launches.append(self.name)
                return self.kernel[grid]  # type: ignore[index]

        monkeypatch.setattr(tk, name, Spy(kernel, name))
    fused.set_ops(select_ops(CUDABackend()))
    ids = torch.randint(0, cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(1))
    pos = positions((1, 1, 2), text_len=4)
    with torch.no_grad():
        torch.testing.assert_close(fused(ids, pos), plain(ids, pos), rtol=1e-4, atol=1e-5)
    # one layer: input/post-attention norms, q/k norms, the final norm; q and k rotated; one MLP
    assert launches.count("_rms_norm_kernel") == 5 and launches.count("_rotary_kernel") == 2
    assert launches.count("_swiglu_kernel") == 1


def test_the_kernel_tests_run_wherever_triton_is_installed_and_there_is_no_gpu() -> None:
    """In the whole suite as in this folder alone, the interpreter is on before triton's first import, so the
    kernel tests here run rather than skip (tests/conftest.py sets it first; a module collected earlier imports
    triton through Inductor)."""
    from tests.ops.triton.conftest import HAVE_TRITON, INTERPRETABLE

    if not HAVE_TRITON or torch.cuda.is_available():
        pytest.skip("triton is not installed, or a GPU runs the kernels compiled")
    assert INTERPRETABLE
