"""Score an engine generation with the trainer's model: the trainer's side of "engine vs trainer logprobs".

Checking that engine and trainer agree on the logprobs of the same tokens is
how weight syncs and sampling settings are verified; this computes the
trainer's side with the same :func:`~roll_async.trainer.losses.token_logprobs`
the loss uses.
"""

from __future__ import annotations

import torch

from roll_async.errors import InvalidInputError
from roll_async.sampling import SamplingSettings
from roll_async.trainer.losses import token_logprobs


@torch.no_grad()
def score_generated_tokens(
    model: torch.nn.Module,
    prompt_token_ids: list[int],
    output_token_ids: list[int],
    sampling: SamplingSettings | None = None,
) -> list[float]:
    """Trainer logprobs of ``output_token_ids`` given ``prompt_token_ids`` (one per output token).

    ``model`` is an HF causal LM (e.g. ``GRPOTrainer.model`` or ``model_loading.load_causal_lm``);
    ``sampling`` the settings the engine sampled with (None: temperature 1, no top-k/top-p).

    Each generated token gets the log-probability the trainer assigns it under the
    sampling distribution the engine used (:mod:`roll_async.sampling`). Compare it
    with the engine's ``GenerationResult.logprobs`` for the same ids: right after
    a weight sync they agree up to kernel noise.
    """
    if not prompt_token_ids:
        raise InvalidInputError(
            "prompt_token_ids is empty: the first generated token needs a prefix to be scored"
        )
    if not output_token_ids:
        return []
    device = next(model.parameters()).device
    ids = torch.tensor(
        [list(prompt_token_ids) + list(output_token_ids)],
        dtype=torch.long,
        device=device,
    )
    attention = torch.ones_like(ids)
    score_mask = torch.zeros_like(ids)
    score_mask[:, len(prompt_token_ids) :] = 1
    out = token_logprobs(
        model,
        ids,
        attention,
        torch.arange(ids.shape[1], device=device).unsqueeze(0),
        score_mask=score_mask,
        sampling=sampling,
    )
    return out.logprobs[0, len(prompt_token_ids) :].tolist()
