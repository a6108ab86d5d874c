"""The overrides that make a config's in-process run small on a shared engine (the session's or the zoo's).

Two groups of two episodes, a batch of four, no warm start, no validation, quiet logs: what each
integration test that trains a shipped config for a step or two needs, in one place.
"""

from __future__ import annotations

#: A shipped config's in-process run, shortened (a test adds max_steps and its own keys after these).
IN_PROCESS = [
    "rollout_batch_size=4",
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=2",
    "trainer.lr=1e-3",
    "trainer.micro_batch_size=4",
    "logging.progress_bar=false",
    "logging.console=false",
    "sft_warmup.enabled=false",
    "eval_steps=0",
]
