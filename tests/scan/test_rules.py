"""Every rule: a snippet it must report and a snippet it must leave alone (one test pair per rule)."""

from __future__ import annotations

import pytest

from difforge.scan import RULES, TARGETS

from .helpers import lines, rules, severity


def test_every_rule_has_text_and_a_severity_somewhere() -> None:
    assert len(RULES) >= 15
    for r in RULES.values():
        assert r.id.startswith("DF") and r.title and r.fix
        assert any(r.severity_for(t) for t in TARGETS), r.id
        for t in TARGETS:
            assert r.severity_for(t) in (None, "error", "warning", "info")
            assert "{" not in r.why_for(t), (r.id, t)


# ---- DF101 import-time CUDA code -----------------------------------------------------------------------
def test_df101_import_time_cuda_calls(run) -> None:
    found = run('''
        import torch
        swiglu = torch.cuda.jiterator._create_jit_fn("template <typename T> T f(T x) { return x; }")

        class Block:
            scale = torch.ones(1).cuda()

        @register(torch.cuda.current_device())
        def f():
            pass
    ''')
    assert lines(found, "DF101") == [3, 6, 8]
    assert severity(found, "DF101") == ["error"] * 3
    assert "DF102" not in rules(found) and "DF114" not in rules(found)


def test_df101_not_at_run_time_guarded_or_in_a_script(run) -> None:
    found = run('''
        import torch
        try:
            swiglu = torch.cuda.jiterator._create_jit_fn("code")
        except Exception:
            swiglu = None
        if torch.cuda.is_available():
            torch.cuda.set_device(0)
        AVAILABLE = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8

        def later():
            return torch.cuda.jiterator._create_jit_fn("code")

        if __name__ == "__main__":
            torch.cuda.synchronize()
    ''')
    assert "DF101" not in rules(found)
    assert lines(found, "DF114") == [12, 15]  # run-time CUDA calls are DF114's


# ---- DF102 .cuda() ------------------------------------------------------------------------------------
def test_df102_dot_cuda(run) -> None:
    found = run('''
        def move(model, x):
            return model.cuda(), x.cuda(0)
    ''')
    assert lines(found, "DF102") == [3]
    assert severity(found, "DF102") == ["warning"]


def test_df102_not_to_device_guarded_or_forwarded(run) -> None:
    found = run('''
        import torch
        from torch import nn

        class M(nn.Module):
            def cuda(self, *args):
                return super().cuda(*args)

        def move(x, device):
            if torch.cuda.is_available():
                x = x.cuda()
            return x.to(device)
    ''')
    assert "DF102" not in rules(found)


# ---- DF103 device detection ----------------------------------------------------------------------------
def test_df103_detection_without_the_target_once_per_function(run) -> None:
    found = run('''
        import torch

        def get_device(index):
            if torch.cuda.is_available():
                return torch.device("cuda", index)
            if torch.backends.mps.is_available():
                return torch.device("mps", index)
            return torch.device("cpu")

        def synchronize(device):
            if device.type in ("cuda", "mps"):
                getattr(torch, device.type).synchronize(device)
    ''')
    assert lines(found, "DF103") == [5, 12]
    assert "knows only cuda, mps" in found[0].message
    assert "DF111" not in rules(found)  # the "cuda" inside the CUDA branch is DF103's


def test_df103_quiet_when_the_function_knows_the_target_or_states_a_requirement(run) -> None:
    code = '''
        import torch

        def get_device():
            if torch.cuda.is_available():
                return "cuda"
            if hasattr(torch, "npu") and torch.npu.is_available():
                return "npu"
            return "cpu"

        def generic():
            if torch.cuda.is_available():
                return torch.accelerator.current_accelerator()

        def mps_quirk(x):
            if torch.backends.mps.is_available():
                x = x.float()
            return x

        def needs_cuda(x):
            if not torch.cuda.is_available():
                raise RuntimeError("this kernel needs CUDA")
            return x

        class CUDABackend:
            def is_available(self):
                return torch.cuda.is_available()
    '''
    assert "DF103" not in rules(run(code))
    assert lines(run(code, "xpu"), "DF103") == [5]  # knows npu, not xpu
    assert "DF103" not in rules(run(code, "cpu"))  # the CPU is every detection's fallback


# ---- DF104 kernel libraries ----------------------------------------------------------------------------
def test_df104_kernel_imports_without_fallback(run) -> None:
    found = run('''
        import flash_attn
        from xformers import ops as xops
        import triton.language as tl

        def attention():
            import apex
    ''')
    assert lines(found, "DF104") == [2, 3, 4, 7]
    assert severity(found, "DF104") == ["error", "error", "error", "warning"]
    assert severity(run("import triton\n", "xpu"), "DF104") == ["info"]


def test_df104_guarded_imports_are_the_fallback(run) -> None:
    found = run('''
        try:
            from flash_attn import flash_attn_func
        except ImportError:
            flash_attn_func = None
        try:
            import xformers
        except (ModuleNotFoundError, OSError):
            xformers = None
        if is_triton_available():
            import triton

        def f():
            try:
                import apex
            except Exception:
                apex = None

        def g():
            with contextlib.suppress(ImportError):
                import sageattention
    ''')
    assert "DF104" not in rules(found)


# ---- DF105 float64 -------------------------------------------------------------------------------------
def test_df105_float64_on_the_device(run) -> None:
    code = '''
        import torch

        def rope(pos, dim, device):
            freqs = torch.arange(dim, device=device, dtype=torch.float64)
            angles = pos.double() * freqs
            return angles.to(torch.float64)
    '''
    found = run(code)
    assert lines(found, "DF105") == [5, 6, 7]
    assert set(severity(found, "DF105")) == {"warning"}
    assert set(severity(run(code, "mps"), "DF105")) == {"error"}
    assert "DF105" not in rules(run(code, "cpu"))


def test_df105_not_on_the_host_in_tables_or_where_the_target_is_handled(run) -> None:
    found = run('''
        import torch

        DTYPES = {"float64": torch.float64, "float32": torch.float32}

        def f(x, sigmas, is_npu):
            if x.dtype == torch.float64:
                x = x.float()
            table = torch.tensor(sigmas, dtype=torch.float64)
            v = x.cpu().double()
            w = x.to("cpu", torch.float64)
            dtype = maybe_adjust_dtype_for_device(torch.float64, x.device)
            other = torch.float32 if is_npu else torch.float64
            return table, v, w, dtype, other
    ''')
    assert "DF105" not in rules(found)


# ---- DF106 complex -------------------------------------------------------------------------------------
def test_df106_complex_rope(run) -> None:
    code = '''
        import torch

        def apply_rotary(x, freqs):
            cis = torch.polar(torch.ones_like(freqs), freqs)
            xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
            z = torch.zeros(4, dtype=torch.cfloat)
            return torch.view_as_real(xc * cis).flatten(3), z
    '''
    found = run(code)
    assert lines(found, "DF106") == [5, 6, 7, 8]
    assert set(severity(found, "DF106")) == {"error"}
    assert set(severity(run(code, "cpu"), "DF106")) == {"info"}


def test_df106_not_for_checks(run) -> None:
    found = run('''
        import torch

        def f(x):
            if x.is_complex() or x.dtype in (torch.complex64, torch.complex128):
                return x.real
            return x
    ''')
    assert "DF106" not in rules(found)


# ---- DF107 CUDA generators -----------------------------------------------------------------------------
def test_df107_cuda_generators(run) -> None:
    found = run('''
        import torch

        def gens(i):
            a = torch.Generator(device="cuda")
            b = torch.Generator("cuda").manual_seed(0)
            c = torch.Generator(device=f"cuda:{i}")
            d = torch.Generator(device=torch.device("cuda"))
            return a, b, c, d
    ''')
    assert lines(found, "DF107") == [5, 6, 7, 8]
    assert "DF111" not in rules(found)  # the device string is part of the generator finding


def test_df107_not_cpu_or_caller_generators(run) -> None:
    found = run('''
        import torch

        def gens(device):
            return torch.Generator("cpu").manual_seed(0), torch.Generator(device=device)
    ''')
    assert "DF107" not in rules(found)


# ---- DF108 torch.compile -------------------------------------------------------------------------------
def test_df108_default_backend_compile(run) -> None:
    code = '''
        import torch

        class Rope:
            @torch.compile(fullgraph=True)
            def table(self, x):
                return x

            @torch.compile
            def other(self, x):
                return x

        def build(fn):
            compiler = torch.compile
            return torch.compile(fn), compiler
    '''
    found = run(code)
    assert lines(found, "DF108") == [5, 9, 14, 15]
    assert "DF108" not in rules(run(code, "cpu"))


def test_df108_not_with_a_backend(run) -> None:
    found = run('''
        import functools
        import torch

        def build(fn, backend, **options):
            a = torch.compile(fn, backend=backend)
            b = torch.compile(fn, **options)
            c = functools.partial(torch.compile, backend=backend)
            return a, b, c
    ''')
    assert "DF108" not in rules(found)


# ---- DF109 / DF110 floating indices ----------------------------------------------------------------------
def test_df109_float_indices_followed_within_a_function(run) -> None:
    found = run('''
        import torch
        import torch.nn.functional as F
        from torch import nn

        class Quantizer(nn.Module):
            def __init__(self, n, d):
                super().__init__()
                self.embed = nn.Embedding(n, d)

            def lookup(self, z):
                ids = z.half()
                return self.embed(ids)

        def positions(x, table, weight, codebook):
            scaled = x * 15
            idx = scaled.round()
            a = table.index_select(0, idx)
            grid = torch.linspace(0, 10, 5)
            b = torch.gather(table, 0, grid)
            c = F.embedding(x / 2, weight)
            half = (torch.arange(8) / 2)
            d = codebook[half]
            return a, b, c, d
    ''')
    assert lines(found, "DF109") == [13, 18, 20, 21, 23]
    assert set(severity(found, "DF109")) == {"error"}


def test_df109_not_after_a_cast_or_for_integer_sources(run) -> None:
    found = run('''
        import torch
        from torch import nn

        class Quantizer(nn.Module):
            def __init__(self, n, d):
                super().__init__()
                self.embed = nn.Embedding(n, d)

            def lookup(self, z):
                ids = z.half()
                ids = ids.long()
                return self.embed(ids)

        def positions(x, table, ids_in, codebook):
            idx = (x * 15).round().long()
            a = table.index_select(0, idx)
            b = table.index_select(0, x.float().to(torch.int64))
            order = torch.argsort(x)
            inverse = torch.empty_like(order)
            c = codebook[inverse]
            d = codebook[ids_in]
            e = torch.gather(table, 0, torch.arange(4) * 2)
            return a, b, c, d, e
    ''')
    assert "DF109" not in rules(found)


def test_df110_index_from_the_modules_own_forward(run) -> None:
    found = run('''
        from torch import nn

        class VQuantizer(nn.Identity):
            def __init__(self, n_e, dim):
                super().__init__()
                self.embedding = nn.Embedding(n_e, dim)

            def dequantize(self, ids):
                z = self.embedding(self.forward(ids))
                return z
    ''')
    assert lines(found, "DF110") == [10]
    assert severity(found, "DF110") == ["warning"]


def test_df110_not_after_a_cast(run) -> None:
    found = run('''
        import torch
        from torch import nn

        class VQuantizer(nn.Identity):
            def __init__(self, n_e, dim):
                super().__init__()
                self.embedding = nn.Embedding(n_e, dim)

            def dequantize(self, ids):
                a = self.embedding(self.forward(ids).to(torch.int32))
                ids = self.forward(ids).long()
                return a, self.embedding(ids)
    ''')
    assert "DF110" not in rules(found)


# ---- DF111 hard-coded device strings -------------------------------------------------------------------
def test_df111_hard_coded_cuda(run) -> None:
    found = run('''
        import torch

        def f(x, i, device="cuda"):
            x = x.to("cuda")
            y = torch.zeros(1, device="cuda:0")
            where = torch.device("cuda")
            name = f"cuda:{i}"
            return x, y, where, name
    ''')
    assert lines(found, "DF111") == [4, 5, 6, 7, 8]


def test_df111_not_in_comparisons_prose_tables_or_cuda_branches(run) -> None:
    found = run('''
        """Runs on "cuda" when it can."""
        import argparse
        import torch

        BACKENDS = {"cuda": 1, "npu": 2}

        class CUDABackend:
            name = "cuda"

        def f(device, name: str):
            """Move to "cuda"."""
            parser = argparse.ArgumentParser()
            parser.add_argument("--device", choices=["cuda", "npu", "cpu"])
            if device.type == "cuda":
                pass
            if name.startswith("cuda"):
                pass
            return getattr(torch, "cuda", None)
    ''')
    assert "DF111" not in rules(found)


# ---- DF112 torch.cuda.amp ------------------------------------------------------------------------------
def test_df112_cuda_amp(run) -> None:
    found = run('''
        import torch
        from torch.cuda.amp import GradScaler

        def step(model, x):
            with torch.cuda.amp.autocast():
                return model(x)
    ''')
    assert lines(found, "DF112") == [3, 6]


def test_df112_not_device_generic_amp(run) -> None:
    found = run('''
        import torch

        def step(model, x, device):
            scaler = torch.amp.GradScaler(device.type)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                return model(x), scaler
    ''')
    assert "DF112" not in rules(found)


# ---- DF113 backend switches ----------------------------------------------------------------------------
def test_df113_cuda_switches(run) -> None:
    found = run('''
        import torch

        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.enable_flash_sdp(True)
    ''')
    assert lines(found, "DF113") == [4, 5, 6]
    assert severity(found, "DF113") == ["info", "info", "warning"]


def test_df113_not_for_reads(run) -> None:
    found = run('''
        import torch

        def f():
            if torch.backends.cudnn.is_available():
                return torch.backends.cudnn.benchmark
    ''')
    assert "DF113" not in rules(found)


# ---- DF114 torch.cuda runtime calls --------------------------------------------------------------------
def test_df114_cuda_runtime_calls(run) -> None:
    found = run('''
        import torch

        def bench(seed):
            torch.cuda.manual_seed(seed)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            return torch.cuda.max_memory_allocated()
    ''')
    assert lines(found, "DF114") == [5, 6, 7, 8]
    assert severity(found, "DF114") == ["warning", "error", "warning", "warning"]
    assert "torch.manual_seed" in found[0].message


def test_df114_not_in_cuda_only_code(run) -> None:
    found = run('''
        import torch

        def free(device):
            if device.type == "cuda":
                torch.cuda.empty_cache()
            torch.accelerator.synchronize()

        def cuda_only():
            if not torch.cuda.is_available():
                return None
            return torch.cuda.get_device_capability()

        def check_device_cuda(x):
            return torch.cuda.get_device_capability(x.device)
    ''')
    assert "DF114" not in rules(found)


# ---- DF115 float16 assumptions -------------------------------------------------------------------------
def test_df115_float16_assumed(run) -> None:
    code = '''
        import torch

        def run(model, x):
            model.half()
            with torch.autocast("npu", dtype=torch.float16):
                return model(x)
    '''
    found = run(code)
    assert lines(found, "DF115") == [5, 6]
    assert set(severity(found, "DF115")) == {"info"}
    assert set(severity(run(code, "cpu"), "DF115")) == {"warning"}


def test_df115_not_for_a_dtype_choice(run) -> None:
    found = run('''
        import torch

        def run(model, x, fp16, device):
            x = x.half() if fp16 else x.bfloat16()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                return model(x)
    ''')
    assert "DF115" not in rules(found)


# ---- aliases ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("imports, call", [
    ("import torch as th", "th.cuda.synchronize()"),
    ("from torch import cuda", "cuda.synchronize()"),
])
def test_import_aliases_are_followed(run, imports: str, call: str) -> None:
    found = run(f"{imports}\n\ndef f():\n    {call}\n")
    assert lines(found, "DF114") == [4]
