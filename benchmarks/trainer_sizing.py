"""Trainer memory per GPU rank for Qwen2.5/Qwen3 0.5B-8B, on paper: computed, never run on a GPU here.

For each model, strategy (one rank; FSDP2 over 2, 4, 8 ranks), precision (fp32; bf16 compute with
fp32 master weights) and tuning (full; LoRA rank 16 on q, k, v, o) it adds up the bytes one rank
holds at the peak of a training step (the start of the backward pass, after the first optimizer
step): parameters, gradients, AdamW state and activations at a stated sequence length and
micro-batch token budget, and compares the total with an 80 GB GPU. ``--write`` renders
``docs/trainer-sizing.md`` (``tests/unit/benchmarks/test_trainer_sizing.py`` fails when the page differs from
this module's output).

The architectures below are copied from the models' published ``config.json`` files
(``Qwen/Qwen2.5-{0.5B,1.5B,3B,7B}``, ``Qwen/Qwen3-{0.6B,1.7B,4B,8B}`` on the Hugging Face hub);
the parameter counts are computed from them and checked against the model cards' totals.

    python -m benchmarks.trainer_sizing                       # print the page
    python -m benchmarks.trainer_sizing --write               # write docs/trainer-sizing.md
    python -m benchmarks.trainer_sizing --tokens 16384 --models Qwen3-0.6B   # other settings, printed
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "trainer-sizing.md"
REGENERATE_COMMAND = "python -m benchmarks.trainer_sizing --write"

GIB = 1 << 30
#: What nvidia-smi reports for an 80 GB H100/A100 (81,559 MiB).
GPU_GIB = 81_559 / 1024
#: Held back from the GPU for the CUDA context, NCCL buffers and allocator fragmentation (an assumption).
RESERVE_GIB = 2.0
#: The stated sequence length, and the tokens of one micro-batch (one sequence per micro-batch).
SEQUENCE_LENGTH = 4096
MICRO_BATCH_TOKENS = 4096
LORA_RANK = 16
STRATEGIES = ("single", "fsdp2x2", "fsdp2x4", "fsdp2x8")
#: FSDP2 on one rank: not on the page (it fits wherever single does), sized for benchmarks.gpu_trainer,
#: which measures the trainer's fsdp2 path on one GPU. Nothing is sharded, but FSDP2 still gathers each
#: unit into compute-dtype copies (and their gradients) instead of autocast's casts.
FSDP2_ONE_RANK = "fsdp2x1"
PRECISIONS = ("fp32", "bf16")
TUNINGS = ("full", "lora")
FP32 = 4


@dataclasses.dataclass(frozen=True)
class Arch:
    """The fields of a published ``config.json`` that the sizes depend on."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    #: Qwen2.5: bias on the q, k and v projections. Qwen3: none, but RMSNorm on q and k per head.
    qkv_bias: bool
    qk_norm: bool
    #: The model card's total ("Number of Parameters"), in billions.
    published_total_b: float
    #: The card's non-embedding count where it gives one, in billions.
    published_non_embedding_b: float | None = None

    # ---- parameter counts -------------------------------------------------------------

    @property
    def q_out(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_out(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def layer_linear_params(self) -> int:
        """The matmul weights of one decoder layer (q, k, v, o, gate, up, down)."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * self.q_out + 2 * h * self.kv_out + self.q_out * h
        return attn + 3 * h * i

    def layer_params(self) -> int:
        """One decoder layer: the matmuls, their biases, the two RMSNorms (and q/k norms)."""
        extra = 2 * self.hidden_size
        if self.qkv_bias:
            extra += self.q_out + 2 * self.kv_out
        if self.qk_norm:
            extra += 2 * self.head_dim
        return self.layer_linear_params() + extra

    def embedding_params(self) -> int:
        """The input embedding, plus the output head when it is not tied to it."""
        tables = 1 if self.tie_word_embeddings else 2
        return tables * self.vocab_size * self.hidden_size

    def root_params(self) -> int:
        """What is not in a decoder layer: embeddings, the untied head, the final norm."""
        return self.embedding_params() + self.hidden_size

    def total_params(self) -> int:
        return self.num_hidden_layers * self.layer_params() + self.root_params()

    def non_embedding_params(self) -> int:
        return self.total_params() - self.embedding_params()

    def lora_params(self, rank: int = LORA_RANK) -> int:
        """Adapter A (r x in) and B (out x r) on q, k, v and o in every layer."""
        h = self.hidden_size
        per_layer = rank * ((h + self.q_out) + 2 * (h + self.kv_out) + (self.q_out + h))
        return self.num_hidden_layers * per_layer

    # ---- activations --------------------------------------------------------------

    def layer_activation_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes one decoder layer saves for backward, per token (no checkpointing).

        Counted from what autograd keeps in a Hugging Face Qwen2/Qwen3 layer with a fused attention
        kernel (no [seq, seq] scores): each RMSNorm keeps its float32 input; in the compute dtype, the
        normed inputs of the q/k/v and gate/up projections (2h), q, k, v for attention, the attention
        output into o (q_out), and in the MLP gate, up, SiLU(gate) and their product (4i); the
        kernel's log-sum-exp (float32, one per head); Qwen3's q/k norms keep their float32 input and
        their output. Dropout is off in these models. The same accounting as Korthikanti et al. 2022
        ("Reducing Activation Recomputation in Large Transformer Models", 34 h bytes per token and
        layer for a GPT layer in 16-bit), redone for SwiGLU and grouped-query attention.
        """
        h, i = self.hidden_size, self.intermediate_size
        fp32_norms = 2 * h * FP32
        compute = 2 * h + (self.q_out + 2 * self.kv_out) + self.q_out + 4 * i
        lse = self.num_attention_heads * FP32
        qk_norm = 0
        if self.qk_norm:
            qk_out = self.q_out + self.kv_out
            qk_norm = qk_out * FP32 + qk_out * dtype_bytes
        return fp32_norms + compute * dtype_bytes + lse + qk_norm


#: From the published config.json files (hidden_size, intermediate_size, num_hidden_layers,
#: num_attention_heads, num_key_value_heads, head_dim (Qwen2.5: hidden_size / heads), vocab_size,
#: tie_word_embeddings); totals from the model cards.
MODELS: tuple[Arch, ...] = (
    Arch(
        "Qwen2.5-0.5B", 896, 4864, 24, 14, 2, 64, 151936, True, True, False, 0.49, 0.36
    ),
    Arch(
        "Qwen2.5-1.5B",
        1536,
        8960,
        28,
        12,
        2,
        128,
        151936,
        True,
        True,
        False,
        1.54,
        1.31,
    ),
    Arch(
        "Qwen2.5-3B", 2048, 11008, 36, 16, 2, 128, 151936, True, True, False, 3.09, 2.77
    ),
    Arch(
        "Qwen2.5-7B",
        3584,
        18944,
        28,
        28,
        4,
        128,
        152064,
        False,
        True,
        False,
        7.61,
        6.53,
    ),
    Arch(
        "Qwen3-0.6B", 1024, 3072, 28, 16, 8, 128, 151936, True, False, True, 0.60, 0.44
    ),
    Arch("Qwen3-1.7B", 2048, 6144, 28, 16, 8, 128, 151936, True, False, True, 1.7, 1.4),
    Arch("Qwen3-4B", 2560, 9728, 36, 32, 8, 128, 151936, True, False, True, 4.0, 3.6),
    Arch(
        "Qwen3-8B", 4096, 12288, 36, 32, 8, 128, 151936, False, False, True, 8.2, 6.95
    ),
)
BY_NAME = {m.name: m for m in MODELS}


def ranks_of(strategy: str) -> int:
    return 1 if strategy == "single" else int(strategy.split("x", 1)[1])


@dataclasses.dataclass(frozen=True)
class Sizing:
    """Bytes one rank holds at the peak, by term. ``*_shard`` terms are divided by the ranks."""

    model: str
    strategy: str
    precision: str
    tuning: str
    tokens: int
    checkpointing: bool
    #: fp32 master weights (full) or the frozen base in the compute dtype (LoRA), plus LoRA adapters.
    param_shard: int
    #: Unsharded compute-dtype copies: FSDP2's gathered units, or autocast's bf16 weight casts on one rank.
    param_working: int
    grad_shard: int
    #: FSDP2: the unsharded gradients of the gathered units before their reduce-scatter.
    grad_working: int
    optim_shard: int
    activations: int
    logits: int

    @property
    def params(self) -> int:
        return self.param_shard + self.param_working

    @property
    def grads(self) -> int:
        return self.grad_shard + self.grad_working

    @property
    def optim(self) -> int:
        return self.optim_shard

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optim + self.activations + self.logits

    @property
    def fits(self) -> bool:
        return self.total / GIB + RESERVE_GIB <= GPU_GIB


def size(
    arch: Arch,
    strategy: str,
    precision: str,
    tuning: str,
    *,
    tokens: int = MICRO_BATCH_TOKENS,
    checkpointing: bool = True,
    lora_rank: int = LORA_RANK,
) -> Sizing:
    """The bytes per rank of one configuration (see the module docstring and docs/trainer-sizing.md)."""
    if (
        strategy not in (*STRATEGIES, FSDP2_ONE_RANK)
        or precision not in PRECISIONS
        or tuning not in TUNINGS
    ):
        raise ValueError(f"unknown configuration {strategy}/{precision}/{tuning}")
    n = ranks_of(strategy)
    d = 2 if precision == "bf16" else FP32
    total = arch.total_params()
    # The unit FSDP2 holds unsharded: the root (embeddings, head, final norm) stays gathered from the
    # start of forward to the end of backward, and one decoder layer at a time beside it.
    gathered = arch.root_params() + arch.layer_params()
    fsdp2 = strategy != "single"
    if tuning == "full":
        param_shard = total * FP32 // n
        grad_shard = total * FP32 // n
        optim_shard = 2 * total * FP32 // n
        if fsdp2:
            param_working = gathered * d
            grad_working = gathered * d
        else:
            # torch.autocast casts each matmul weight to bf16 once and keeps the cast for backward.
            linear = arch.num_hidden_layers * arch.layer_linear_params()
            head = arch.vocab_size * arch.hidden_size
            param_working = (linear + head) * d if precision == "bf16" else 0
            grad_working = 0
    else:
        adapters = arch.lora_params(lora_rank)
        param_shard = (total * d + adapters * FP32) // n
        grad_shard = adapters * FP32 // n
        optim_shard = 2 * adapters * FP32 // n
        param_working = gathered * d if fsdp2 else 0
        grad_working = 0
    per_layer = arch.layer_activation_bytes_per_token(d) * tokens
    if checkpointing:
        activations = arch.num_hidden_layers * tokens * arch.hidden_size * d + per_layer
    else:
        activations = arch.num_hidden_layers * per_layer
    logits = tokens * arch.vocab_size * (d + FP32)
    return Sizing(
        arch.name,
        strategy,
        precision,
        tuning,
        tokens,
        checkpointing,
        param_shard,
        param_working,
        grad_shard,
        grad_working,
        optim_shard,
        activations,
        logits,
    )


# ---------------------------------------------------------------------------------------
# The page


def _g(nbytes: float) -> str:
    gib = nbytes / GIB
    return f"{gib:.2f}" if gib < 10 else f"{gib:.1f}"


def _fits(s: Sizing) -> str:
    used = (s.total / GIB + RESERVE_GIB) / GPU_GIB
    return f"yes ({used:.0%})" if s.fits else f"**no** ({used:.0%})"


def model_table(arch: Arch, tokens: int) -> list[str]:
    lines = [
        f"### {arch.name}",
        "",
        f"{arch.total_params() / 1e9:.3f}B parameters ({arch.non_embedding_params() / 1e9:.3f}B without "
        f"embeddings; card: {arch.published_total_b}B), {arch.num_hidden_layers} layers, hidden "
        f"{arch.hidden_size}, MLP {arch.intermediate_size}, heads {arch.num_attention_heads}/"
        f"{arch.num_key_value_heads} (q/kv) x {arch.head_dim}, vocab {arch.vocab_size}, "
        f"{'tied' if arch.tie_word_embeddings else 'untied'} embeddings; LoRA r{LORA_RANK} on q,k,v,o: "
        f"{arch.lora_params() / 1e6:.2f}M adapter parameters.",
        "",
        "| strategy | precision | tuning | params | grads | AdamW | activations (ckpt) | logits | total (ckpt) | fits 80 GB (ckpt) | total (no ckpt) | fits 80 GB (no ckpt) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for tuning in TUNINGS:
        for precision in PRECISIONS:
            for strategy in STRATEGIES:
                s = size(arch, strategy, precision, tuning, tokens=tokens)
                nc = size(
                    arch,
                    strategy,
                    precision,
                    tuning,
                    tokens=tokens,
                    checkpointing=False,
                )
                lines.append(
                    f"| {strategy} | {precision} | {tuning} | {_g(s.params)} | {_g(s.grads)} | "
                    f"{_g(s.optim)} | {_g(s.activations)} | {_g(s.logits)} | **{_g(s.total)}** | "
                    f"{_fits(s)} | {_g(nc.total)} | {_fits(nc)} |"
                )
    return lines + [""]


def summary_table(tokens: int) -> list[str]:
    """One line per model: the fewest FSDP2 ranks (1 = one GPU) at which each setup fits, with checkpointing."""
    head = [f"{p} {t}" for t in TUNINGS for p in PRECISIONS]
    lines = [
        "| model | parameters | " + " | ".join(head) + " |",
        "|---|---:|" + "---|" * len(head),
    ]
    for arch in MODELS:
        cells = []
        for tuning in TUNINGS:
            for precision in PRECISIONS:
                fit = next(
                    (
                        ranks_of(st)
                        for st in STRATEGIES
                        if size(arch, st, precision, tuning, tokens=tokens).fits
                    ),
                    None,
                )
                cells.append(
                    "> 8 GPUs"
                    if fit is None
                    else ("1 GPU" if fit == 1 else f"{fit} GPUs")
                )
        lines.append(
            f"| {arch.name} | {arch.total_params() / 1e9:.2f}B | "
            + " | ".join(cells)
            + " |"
        )
    return lines + [""]


#: Published peaks (docs: ../shared/research/trainer-scaling.md section 2, prime-rl's CI baselines
#: benchmarks/baselines/*.json: sequence length 16,384, full activation checkpointing, FA3, bf16).
CROSS_CHECKS = (
    ("Qwen3-0.6B", "single", "lora", 16384, 5.1, "prime-rl, 1xH100, LoRA r16"),
    ("Qwen3-0.6B", "single", "full", 16384, 12.5, "prime-rl, 1xH100, full"),
    ("Qwen3-4B", "single", "lora", 16384, 23.3, "prime-rl, 1xH100, LoRA r16"),
    ("Qwen3-4B", "fsdp2x8", "full", 16384, 17.1, "prime-rl, 8xH100, full"),
)


def cross_check_rows() -> list[tuple[str, str, str, int, float, Sizing]]:
    """(model, setup, source, tokens, published GiB, this estimate's bf16 sizing) per published peak."""
    return [
        (
            name,
            f"{strategy} bf16 {tuning}",
            source,
            tokens,
            published,
            size(BY_NAME[name], strategy, "bf16", tuning, tokens=tokens),
        )
        for name, strategy, tuning, tokens, published, source in CROSS_CHECKS
    ]


def cross_check_table() -> list[str]:
    lines = [
        "| model | setup (source) | tokens per micro-batch | published peak | this estimate | of which logits | this estimate less logits | published / this estimate, with / less logits |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, setup, source, tokens, published, s in cross_check_rows():
        less = s.total - s.logits
        lines.append(
            f"| {name} | {setup} ({source}) | {tokens:,} | {published} GiB | {_g(s.total)} GiB | "
            f"{_g(s.logits)} GiB | {_g(less)} GiB | "
            f"{published * GIB / s.total:.2f} / {published * GIB / less:.2f} |"
        )
    return lines + [""]


def _sequences(tokens: int) -> str:
    if tokens <= SEQUENCE_LENGTH:
        return "one sequence" if tokens == SEQUENCE_LENGTH else "part of a sequence"
    return f"{tokens / SEQUENCE_LENGTH:g} sequences"


def render(
    tokens: int = MICRO_BATCH_TOKENS, models: Sequence[str] | None = None
) -> str:
    """The whole page, as markdown."""
    chosen = [BY_NAME[m] for m in models] if models else list(MODELS)
    example = BY_NAME["Qwen3-8B"]
    lines = [
        "# Trainer sizing: bytes per GPU rank for Qwen2.5 and Qwen3, 0.5B to 8B",
        "",
        "<!-- Generated by benchmarks/trainer_sizing.py; do not edit by hand. Regenerate with:",
        f"     {REGENERATE_COMMAND} -->",
        "",
        "**Computed, never run on a GPU here.** These are sums of formulas over the published model",
        "architectures (copied from each model's `config.json` into `benchmarks/trainer_sizing.py`), for",
        "planning which setup to try on which GPUs. They leave out the CUDA context, NCCL buffers and",
        f"allocator fragmentation except for a flat {RESERVE_GIB:.0f} GiB reserve, and temporaries",
        "that live only within one kernel or one optimizer step. Measure before you rely on one.",
        "",
        f"**Setting.** Sequence length {SEQUENCE_LENGTH:,} tokens; a micro-batch of {tokens:,} tokens "
        f"({_sequences(tokens)});",
        "one micro-batch's activations alive at a time (gradient accumulation over the others); the peak taken at the start",
        "of backward after the first optimizer step, so everything below is resident at once. GiB = 2^30",
        f'bytes; an "80 GB" GPU has {GPU_GIB:.1f} GiB (81,559 MiB as nvidia-smi reports an H100 or A100',
        f"80GB); a setup *fits* when its total plus the {RESERVE_GIB:.0f} GiB reserve is at most that (the",
        "percentage is that sum over the GPU).",
        "",
        "**Strategies.** `single`: one rank holds everything. `fsdp2xN`: FSDP2 (`fully_shard` per",
        "decoder layer and on the root) over N ranks: parameters, gradients and AdamW state sharded 1/N;",
        "unsharded at a time, in the compute dtype, are the root unit (embeddings, untied head, final",
        "norm: gathered from the start of forward to the end of backward, because the root's forward",
        "spans the whole model) and one decoder layer (prefetching the next would add one more), and",
        "the same units' unsharded gradients before their reduce-scatter.",
        "",
        "**Precision.** `fp32`: weights, gradients, compute all float32. `bf16`: bfloat16 compute with",
        "float32 master weights, float32 gradients and float32 AdamW state. With FSDP2 that is",
        "`MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`: the float32 shards stay,",
        "the all-gather casts to bfloat16. On one rank it is this trainer's `trainer.param_dtype:",
        "bfloat16` (`torch.autocast`), which casts each matmul weight to bfloat16 once per forward and",
        "keeps the cast for backward: the `params` column counts that copy (2 bytes per matmul weight).",
        "",
        f"**LoRA.** Rank {LORA_RANK} on q, k, v and o of every layer. The frozen base weights are held in",
        "the compute dtype (bf16 or fp32; no master copy, no gradients, no optimizer state); adapter",
        "parameters, gradients and AdamW state in float32 (sharded 1/N too). Activations are as for full",
        "fine-tuning (backward still runs through every layer); the adapters' own [tokens, r] inputs are",
        "left out (under 0.5% of them).",
        "",
        "**Terms, per rank** (P parameters, A adapter parameters, N ranks, d bytes of the compute dtype,",
        "T tokens per micro-batch, L layers, h hidden, V vocab):",
        "",
        "- parameters: full 4P/N (+ unsharded copies, above); LoRA (dP + 4A)/N (+ the gathered units).",
        "- gradients: full 4P/N (+ the gathered units' unsharded gradients, d bytes each); LoRA 4A/N.",
        "- AdamW: two float32 moments, 8P/N (LoRA 8A/N).",
        "- activations with gradient checkpointing (`ckpt`, a checkpoint per decoder layer): each",
        "  layer's input hidden state, L x T x h x d, plus one layer's full activations while it is",
        "  recomputed in backward. Without checkpointing: L layers' full activations.",
        "- one layer's full activations, per token: each RMSNorm's float32 input (2 x 4h); in the",
        "  compute dtype the normed inputs of the q/k/v and gate/up projections (2h), q, k and v, the",
        "  attention output (heads x head_dim) and the MLP's gate, up, SiLU(gate) and their product",
        "  (4 x intermediate); the attention kernel's float32 log-sum-exp per head; for Qwen3 the q/k",
        "  norms' float32 inputs and outputs. A fused (flash / SDPA) attention kernel is assumed, so",
        "  there is no T x T term. This is Korthikanti et al. 2022's accounting (34h bytes per token and",
        "  layer for a 16-bit GPT layer) redone for SwiGLU and grouped-query attention; for Qwen3-8B in",
        f"  bf16 it gives {example.layer_activation_bytes_per_token(2) / 1024:.0f} KiB per token and layer,"
        f" {example.num_hidden_layers * example.layer_activation_bytes_per_token(2) / 1e6:.1f} MB per"
        " token for the model.",
        "- logits: T x V in the compute dtype (the head's output at every position) plus a float32",
        "  copy for the log-softmax, worst case every token scored (this trainer upcasts only the",
        "  scored response positions, `roll_async/trainer/losses.py`). Trainers that fuse the head",
        "  with the loss or chunk it over tokens avoid most of this term.",
        "",
        "## Fewest GPUs that fit, with checkpointing",
        "",
        "The smallest of 1 (`single`), 2, 4 or 8 (`fsdp2xN`) at which the total fits; 80 GB GPUs.",
        "",
        *summary_table(tokens),
        "## Cross-check against published peaks",
        "",
        "Published peak memory per GPU from `trainer-scaling.md` section 2 (prime-rl's CI baselines,",
        "`benchmarks/baselines/*.json`: sequence length 16,384, full activation checkpointing, FA3,",
        "bf16), against this estimate's bf16 figure at 16,384 tokens per micro-batch:",
        "",
        *cross_check_table(),
        "Every published peak lies between this estimate's total and its total less the logits term",
        "(0.3-0.9 of the first, 1.05-1.8 of the second). The logits term is where the estimate is",
        "coarsest: it holds [16,384 x 151,936] logits in bf16 plus a float32 copy (13.9 GiB), while",
        "prime-rl fuses or chunks the head with the loss and never holds them whole; and its peaks",
        "include temporaries and allocator caching that this estimate leaves out. The closest line is",
        "Qwen3-0.6B full on one GPU: 11.9 GiB less logits against 12.5 published. Read the tables as",
        "upper bounds at the logits and good to a factor of about 2 overall. The other published",
        "figure, verl's minimum GPUs (with offload and checkpointing: full GRPO of a 7B on 2 x H800,",
        "GRPO-LoRA of Qwen2.5 0.5B-7B on one H100), agrees with the summary above: Qwen2.5-7B full",
        "fine-tuning fits from 2 ranks (bf16 or fp32), LoRA on one.",
        "",
        f"## Per model, {tokens:,} tokens per micro-batch",
        "",
        "GiB per rank. `ckpt`: gradient checkpointing per decoder layer; `no ckpt`: none (only the",
        "activations change).",
        "",
    ]
    for arch in chosen:
        lines += model_table(arch, tokens)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.trainer_sizing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help=f"write {PAGE.relative_to(REPO)} (the default settings) instead of printing",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=MICRO_BATCH_TOKENS,
        help="tokens per micro-batch (default: %(default)s; the page uses the default)",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        choices=sorted(BY_NAME),
        default=None,
        help="only these models",
    )
    args = parser.parse_args(argv)
    if args.write:
        if args.tokens != MICRO_BATCH_TOKENS or args.models:
            parser.error(
                "--write renders the page at the default settings; drop --tokens/--models"
            )
        PAGE.write_text(render())
        print(PAGE.relative_to(REPO))
    else:
        sys.stdout.write(render(args.tokens, args.models))
    return 0


if __name__ == "__main__":
    sys.exit(main())
