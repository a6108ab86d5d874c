"""vLLM's bfloat16 CPU kernels on small inputs, checked against float32: the child process of the bf16 probe.

Run as ``python -m roll_async.engine.cpu_bf16_kernels`` by
roll_async.engine.cpu_bf16_probe; a SIGILL here (not in an engine's worker)
is how a CPU that lists bfloat16 instructions it cannot run is found. See that
module for which kernels and why they are called through ``torch.ops._C``.
"""

from __future__ import annotations

import importlib.util
import platform
from pathlib import Path

import torch
from torch._ops import _OpNamespace

from roll_async.errors import UnsupportedHostError


def _kernel_library() -> Path:
    """The x86 kernel library vLLM's ``CpuPlatform.import_kernels`` loads on this CPU."""
    if torch.cpu._is_avx512_supported():
        name = "_C" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512"
    else:
        name = "_C_AVX2"
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or spec.origin is None:
        raise UnsupportedHostError("vLLM is not installed")
    found = sorted(Path(spec.origin).parent.glob(f"{name}.*so"))
    if not found:
        raise UnsupportedHostError(f"vLLM's kernel library {name} is missing")
    return found[0]


def _check(name: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    """bfloat16 against float32: a few percent of the output's scale (garbage or NaN fails)."""
    error = float((got.float() - expected).abs().max())
    scale = float(expected.abs().max()) + 1e-3
    if not error <= 0.05 * scale:
        raise UnsupportedHostError(
            f"{name}: bfloat16 result off by {error:.3g} (scale {scale:.3g})"
        )


def _linears(ops: _OpNamespace, amx: bool) -> list[str]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 512, generator=generator).to(torch.bfloat16)
    ran = []
    # oneDNN: vLLM's bfloat16 linear for every weight above 1 MiB, and for all of them without AMX
    weight = (torch.randn(1024, 512, generator=generator) / 512**0.5).to(torch.bfloat16)
    handler = torch.tensor(
        ops.create_onednn_mm_handler(weight.t(), 32), dtype=torch.int64
    )
    out = torch.empty(5, 1024, dtype=torch.bfloat16)
    ops.onednn_mm(out, x, None, handler)
    _check("onednn_mm", out, x.float() @ weight.float().t())
    ran.append("onednn_mm")
    if (
        amx
    ):  # AMX brgemm: vLLM's bfloat16 linear for small weights (check_cpu_sgl_kernel)
        small = (torch.randn(64, 512, generator=generator) / 512**0.5).to(
            torch.bfloat16
        )
        packed = ops.convert_weight_packed(small)
        out = torch.empty(5, 64, dtype=torch.bfloat16)
        ops.weight_packed_linear(out, x, packed, None, True)
        _check("weight_packed_linear", out, x.float() @ small.float().t())
        ran.append("weight_packed_linear")
    return ran


def _attention(ops: _OpNamespace, isa: str) -> str:
    """One causal prefill through vLLM's CPU paged attention (head 64, block 128: vLLM's CPU defaults)."""
    heads, kv_heads, head, block, seq = 4, 2, 64, 128, 7
    generator = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(seq, n, head, generator=generator).to(torch.bfloat16)
        for n in (heads, kv_heads, kv_heads)
    )
    cache = torch.zeros(2, kv_heads, 2 * block, head, dtype=torch.bfloat16)
    key_cache, value_cache = cache.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(
        k, v, key_cache, value_cache, torch.arange(seq), isa, 1.0, 1.0, "auto"
    )
    starts = torch.tensor([0, seq], dtype=torch.int32)
    lengths = torch.tensor([seq], dtype=torch.int32)
    metadata = ops.get_scheduler_metadata(
        1,
        heads,
        kv_heads,
        head,
        lengths,
        torch.bfloat16,
        starts,
        True,
        -1,
        isa,
        False,
        None,
        "auto",
    )
    out = torch.empty_like(q)
    ops.cpu_attention_with_kv_cache(
        q,
        key_cache,
        value_cache,
        out,
        starts,
        lengths,
        head**-0.5,
        True,
        None,
        -1,
        torch.tensor([[0]], dtype=torch.int32),
        0.0,
        metadata,
        None,
        None,
        1.0,
        1.0,
        "auto",
    )
    group = heads // kv_heads
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1),
        k.float().repeat_interleave(group, 1).transpose(0, 1),
        v.float().repeat_interleave(group, 1).transpose(0, 1),
        is_causal=True,
    ).transpose(0, 1)
    _check(f"cpu_attention_with_kv_cache[{isa}]", out, expected)
    return f"cpu_attention_with_kv_cache[{isa}]"


def run_kernels() -> str:
    """Run vLLM's bfloat16 CPU kernels (in the child); returns what ran, raises if any is wrong."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"not probed on {platform.machine()} (x86 kernels only)"
    library = _kernel_library()
    torch.ops.load_library(str(library))
    ops = torch.ops._C
    amx = torch.cpu._is_amx_tile_supported()
    ran = _linears(ops, amx)
    ran.append(_attention(ops, "amx" if amx else "vec"))
    return f"{', '.join(ran)} ran in bfloat16 ({library.name})"


if __name__ == "__main__":
    print(run_kernels())
