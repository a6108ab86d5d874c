"""The config's sections as dataclasses: every key, its type, its default, and its meaning in a ``#:`` comment.

The fixed sets of words a key accepts are ``Literal`` types declared here, so one generic pass at load can
check them all (roll_async/config/validation.py) and the reference page can list them
(roll_async/config/reference.py renders docs/config-reference.md from this file).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

from roll_async.config.field_checks import bounded
from roll_async.config.reward_rules import RewardRules
from roll_async.errors import ConfigError

#: ``env_type: verifiers:<env id>``: a verifiers environment, played by :data:`VERIFIERS_AGENT`.
VERIFIERS_PREFIX = "verifiers:"
#: The built-in agent function of verifiers tags.
VERIFIERS_AGENT = "roll_async.agent_gateway.verifiers_agent:verifiers_agent"
#: Env types an agent (``custom_envs.<Tag>.agent``) can drive: each episode the env starts its task's
#: workspace, the agent gets a handle to it (``task.workspace``) and the env's verifier gives the reward.
AGENT_WORKSPACE_ENV_TYPES: tuple[str, ...] = ("swe",)

#: omegaconf's MISSING: OmegaConf.structured reads a field whose default is this string as required.
#: Spelled here, not imported, so the dataclasses (and the trainer that takes them) import without
#: omegaconf: benchmarks.gpu_trainer runs on GPU nodes that have torch, transformers and peft alone.
MISSING: Any = "???"

# ---------------------------------------------------------------------------
# Choices: the words a key accepts

Mode = Literal["sync", "async"]
#: engine.request_transport (roll_async/runtime/zmq_calls.py; ray: one actor call per request or hand-over).
RequestTransport = Literal["zmq", "ray"]
#: vLLM's dtype names (vllm.config.model.ModelDType).
EngineDtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
#: The trainer's dtype names (roll_async.trainer.grpo_trainer).
TrainerDtype = Literal["float32", "fp32", "bfloat16", "bf16", "float16", "fp16"]
#: trainer.param_dtype: the built-in trainer's compute dtype (torch.autocast); weights stay float32.
TrainerParamDtype = Literal["float32", "bfloat16"]
#: custom_envs.<Tag>.isolation (roll_async.env_service.process_env for ``process``).
Isolation = Literal["none", "process", "inline"]
#: <env_manager>.rollout_sched_policy (roll_async/runtime/sched_policy.py maps each to a Linux policy).
RolloutSchedPolicy = Literal["batch", "normal"]
WorkerPlacement = Literal["spread", "pack"]
#: <env_manager>.group_filter (roll_async/scheduler/filters.py holds a predicate per name).
GroupFilterName = Literal["none", "zero_variance"]
ServeOrder = Literal["fifo", "first_complete"]
#: <env_manager>.redundancy_keep (roll_async/scheduler/group_queue.py "Completion and redundancy").
RedundancyKeep = Literal["seat_order", "first_finished"]
AdvantageEstimator = Literal["grpo", "rloo"]
LossAgg = Literal["token_mean", "seq_mean"]
TrainerPlacement = Literal["driver", "ray_actor"]
#: trainer.strategy: one process holds the whole model, or SPMD ranks shard it with torch FSDP2.
TrainerStrategy = Literal["single", "fsdp2"]
InFlightPolicy = Literal["abort", "wait", "keep"]
#: trainer.lora.sync (roll_async/trainer/lora.py): what a weight sync sends the engines.
LoraSync = Literal["adapter", "merged"]


# ---------------------------------------------------------------------------
# Sections


@dataclass
class ModelConfig:
    """The HF model that the engine serves and the trainer trains."""

    #: Local HF model directory or hub id; None (or tiny) means the offline tiny model, tiny-vl the tiny vision-language one, tiny-<family> a zoo family's (tiny-qwen2_5, tiny-llama3, ...; built on first use).
    path: str | None = None
    #: Let transformers and vLLM run the model repository's own Python code (custom architectures).
    trust_remote_code: bool = False
    #: A Jinja chat template file that replaces the tokenizer's own (for templates that cannot be used as shipped).
    chat_template: str | None = None
    #: Extra variables for every chat-template render, e.g. {enable_thinking: false} for Qwen3.
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    #: The vLLM tool parser (hermes, llama3_json, mistral, ...) that turns agent replies into tool_calls; None detects it from the chat template.
    tool_parser: str | None = None


@dataclass
class EngineConfig:
    """The vLLM engine replicas that generate every turn."""

    #: Engine replicas (one vLLM AsyncLLM each); requests are spread over them by load.
    num_replicas: int = bounded(1, ge=1)
    #: vLLM's weight and activation dtype; auto takes the model's (bfloat16 on vLLM's CPU backend; float32 where a probe finds the CPU cannot run vLLM's bfloat16 kernels).
    dtype: EngineDtype = "auto"
    #: Longest prompt + response, in tokens, a replica accepts (vLLM max_model_len).
    max_model_len: int = 2048
    #: Most sequences a replica runs in one engine step (vLLM max_num_seqs).
    max_num_seqs: int = 64
    #: Most tokens a replica processes in one engine step; None leaves vLLM's default (on CPU at least max_model_len).
    max_num_batched_tokens: int | None = None
    #: GPU: fraction of GPU memory for weights + KV cache. Ignored on CPU (see cpu_kv_cache_space_gib).
    gpu_memory_utilization: float = 0.85
    #: CPU only: GiB of host memory reserved for the KV cache (VLLM_CPU_KVCACHE_SPACE).
    cpu_kv_cache_space_gib: float = 1.0
    #: Reuse the KV cache of a shared prompt prefix (each turn extends the previous turn's prompt).
    enable_prefix_caching: bool = True
    #: Run the model eagerly, without CUDA graphs (faster start-up; needed on CPU).
    enforce_eager: bool = True
    #: GPUs each replica shards its model over.
    tensor_parallel_size: int = 1
    #: vLLM's random seed for sampling.
    seed: int = 0
    #: Seconds to wait for an engine replica to come up before failing with its log tail.
    startup_timeout_s: float = 600.0
    #: How EnvManagerWorkers send each turn's generate request to an engine replica, and each episode's
    #: hand-over to the queue actor: zmq (the actor's ZMQ socket: IPC on its node, TCP across nodes; ~0.22 ms
    #: of CPU per call) or ray (an actor call, ~1.35 ms; benchmarks/ray_call_cost.py). Control calls (abort,
    #: stats, weights, get_batch) are Ray calls either way. See roll_async/runtime/zmq_calls.py.
    request_transport: RequestTransport = "zmq"
    #: Extra vllm.AsyncEngineArgs keyword arguments, passed through unchanged.
    engine_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenerationConfig:
    """How each turn is sampled, and how a failed engine request is retried."""

    #: Sampling temperature of every turn (the trainer scores under the same distribution).
    temperature: float = 1.0
    #: Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1.0: all).
    top_p: float = 1.0
    #: Keep only the top_k most likely tokens (-1: all).
    top_k: int = -1
    #: Retries of a failed engine request before the error surfaces (naming env, turn, request).
    max_retries: int = bounded(2, ge=0)
    #: Seconds before the first retry of a failed engine request; doubled for each further retry.
    retry_backoff_s: float = 0.5
    #: Seconds an engine request may take before it counts as failed (and is retried).
    request_timeout_s: float = 600.0


@dataclass
class RewardConfig(RewardRules):
    """``custom_envs.<Tag>.reward``: a model (an LLM judge or a reward model) that scores each finished episode (or turn).

    Its rules (checked at load, before any engine starts) are in roll_async/config/reward_rules.py; the
    serving and scoring in roll_async/rewards.
    """

    engine_keys: ClassVar[frozenset[str]] = frozenset(
        f.name for f in fields(EngineConfig)
    )

    #: judge (an LLM on its own vLLM engine writes a score) or reward_model (a sequence-classification model).
    kind: str = "judge"
    #: Local HF model directory of the judge / reward model, or ``tiny`` for the offline tiny one.
    model_path: str | None = None
    #: Text given to the model; fields {question}, {response}, {reference}, {conversation}; None: the kind's default.
    prompt_template: str | None = None
    #: add (env reward + weight * score) or replace (weight * score; the env reward stays in metrics); per_turn: of each scored turn.
    mode: str = "add"
    #: Multiplies the model's score before it enters the reward.
    weight: float = 1.0
    #: Most scoring calls in flight at once from one scorer (an asyncio.Semaphore).
    max_concurrency: int = bounded(8, ge=1)
    #: Seconds one scoring call may take; past it the call is aborted and counted as a timeout.
    timeout_s: float = bounded(60.0, gt=0, note="seconds")
    #: Retries of a call that timed out or failed (a reply without a score is not retried).
    max_retries: int = bounded(1, ge=0)
    #: Seconds before the first retry; doubled for each further retry.
    retry_backoff_s: float = bounded(0.5, ge=0)
    #: judge: most tokens of the judge's reply.
    max_tokens: int = bounded(256, ge=1)
    #: judge: sampling temperature of the judge (0: greedy).
    temperature: float = 0.0
    #: judge: regex whose first group is the score (last match wins); None: ``Score: n`` or ``\\boxed{n}``.
    score_pattern: str | None = None
    #: judge: the lowest score of the rubric (maps to 0); a score outside [score_min, score_max] counts as a parse failure.
    score_min: float = 0.0
    #: judge: the highest score of the rubric (maps to 1).
    score_max: float = 10.0
    #: reward_model: most texts in one forward pass.
    batch_size: int = bounded(16, ge=1)
    #: reward_model: seconds the actor waits for more texts before running a partial batch.
    batch_window_s: float = bounded(0.01, ge=0)
    #: Score each env-stepped turn's reply (question: the user text it answered) instead of the finished episode; the episode reward is then the sum of the turn rewards. Env tags only (not agent).
    per_turn: bool = False
    #: judge: engine replicas serving the judge (never the policy's, never weight-synced).
    num_replicas: int = bounded(1, ge=1)
    #: Longest prompt + reply, in tokens (judge engine max_model_len; reward_model truncation length).
    max_model_len: int = bounded(2048, ge=16, note="(the prompt + reply length)")
    #: judge: further EngineConfig keys of the judge engine (e.g. {dtype: float32, cpu_kv_cache_space_gib: 0.5}).
    engine: dict[str, Any] = field(default_factory=dict)
    #: Let transformers / vLLM run the model repository's own code.
    trust_remote_code: bool = False


@dataclass
class OpponentPoolConfig:
    """``custom_envs.<Tag>.pool``: the policy snapshots a ``pool`` game seat draws its opponent from, per episode."""

    #: Each game, a ``pool`` seat plays the policy k weight versions back, k drawn uniformly from 1..last_k
    #: (LoRA runs: the engines keep last_k + 1 adapters loaded; full-weight runs: one engine per k); 0: no pool.
    last_k: int = bounded(0, ge=0)
    #: Draw k from 0..last_k instead: k = 0 is the current policy itself, playing untrained (self-play in
    #: which only the policy seat's tokens train, so every game still gives one trajectory per policy seat).
    include_current: bool = False

    def first_k(self) -> int:
        """The smallest k a pool seat draws: 0 with ``include_current``, else 1."""
        return 0 if self.include_current else 1


@dataclass
class CustomEnvConfig:
    """One ``custom_envs.<Tag>`` entry: which env to build and how it talks to the model."""

    #: Registered env name (e.g. sokoban, gymnasium:FrozenLake-v1), ``package.module:Class``, agent, or
    #: ``verifiers:<env id>`` (a verifiers environment, played as an agent session; env_config: its arguments).
    env_type: str = MISSING
    #: Keyword arguments of the env's constructor.
    env_config: dict[str, Any] = field(default_factory=dict)
    #: Turns per episode; the episode ends (truncated) after this many.
    max_steps: int = bounded(10, ge=1)
    #: Most tokens the model may generate in one turn.
    max_tokens_per_step: int = bounded(64, ge=1)
    #: System message of every episode ('' for none).
    system_prompt: str = "You are an agent solving a task step by step. Reply with your action inside <answer></answer>."
    #: First user message; fields: {instruction}, {observation}.
    instruction_template: str = "{instruction}\n{observation}"
    #: Later user messages; fields: {observation}, {reward}, {turn}.
    observation_template: str = "{observation}"
    #: Stop strings for this env's turns (NeMo-RL style per-env stops); kept in the output.
    stop: list[str] = field(default_factory=lambda: ["</answer>"])
    #: Agent session (``env_type: agent``): ``pkg.module:function`` naming ``async def agent(client, task)``;
    #: the agent's requests set their own messages and stop strings (system_prompt, templates, stop unused).
    #: With ``env_type: swe`` the agent drives the task's workspace (``task.workspace``) and the swe verifier scores it.
    agent: str | None = None
    #: Run this tag's envs on env servers (``roll-async env-server``): one URL or a list, spread by load.
    service_url: Any = None
    #: Retries of transport errors per env-server call before the server counts as down.
    service_max_retries: int = bounded(3, ge=0)
    #: none: envs run in the worker's threads; process: each env instance in its own child process
    #: (a call past env_step_timeout_s kills it; a crash is contained); inline: sync env calls run on the
    #: worker's event loop, no thread hop (for fast, trusted envs: a call past env_step_timeout_s fails
    #: its episode only once it returns, and a hang stops every env of its worker).
    isolation: Isolation = "none"
    #: A model that scores each finished episode of this tag (see the custom_envs.<Tag>.reward section); null: env reward only.
    reward: RewardConfig | None = None
    #: A game with seats (env_type names a multi-player game): who plays each seat, in seat order: policy (trained;
    #: one trajectory per policy seat and game), random, heuristic, scripted:package.module:function or
    #: frozen:<model path> (another model on its own engine, never weight-synced), snapshot:<k> (the policy k
    #: syncs back: a LoRA adapter of the policy's engines, or in a full-weight run an engine of its own per k)
    #: or pool (see roll_async/config/seat_rules.py).
    #: group_size then counts games; empty: a single-agent env.
    seats: list[str] = field(default_factory=list)
    #: The snapshots a ``pool`` seat draws from (see the custom_envs.<Tag>.pool section).
    pool: OpponentPoolConfig = field(default_factory=OpponentPoolConfig)

    @property
    def agent_function(self) -> str | None:
        """The ``pkg.module:function`` that plays this tag's episodes as an agent session, None for env tags.

        ``env_type: verifiers:<env id>`` is an agent session too: its built-in agent runs the verifiers
        environment's rollout against the session's endpoint (``roll_async.agent_gateway.verifiers_agent``).
        """
        if self.agent:
            return self.agent
        if self.env_type.startswith(VERIFIERS_PREFIX):
            return VERIFIERS_AGENT
        return None

    @property
    def drives_workspace(self) -> bool:
        """True when the tag's agent drives its env's workspace (``env_type: swe`` with ``agent``): the env
        starts and verifies each episode, the agent acts in between through ``task.workspace``."""
        return bool(self.agent) and self.env_type in AGENT_WORKSPACE_ENV_TYPES

    def fill(self, tag: str, template_name: str, fields: dict[str, Any]) -> str:
        """``instruction_template`` or ``observation_template`` filled with ``fields``; a template naming
        another field raises ConfigError naming the key and the fields it may use."""
        template: str = getattr(self, template_name)
        try:
            return template.format(**fields)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"custom_envs.{tag}.{template_name}={template!r} cannot be filled ({type(exc).__name__}: {exc}); "
                f"it may use the fields {{{'}, {'.join(fields)}}} (write literal braces as {{{{ and }}}})"
            ) from None


@dataclass
class EnvManagerConfig:
    """The env groups of one scheduler: ``train_env_manager`` (rollouts) or ``val_env_manager`` (validation)."""

    #: Env groups kept running; each group plays one episode specification (env config and seed).
    num_env_groups: int = bounded(4, ge=0)
    #: Trajectories per group (GRPO's group: same env config and seed).
    group_size: int = bounded(4, ge=1)
    #: Extra env instances per group (seats beyond group_size); redundancy_keep decides which trajectories a group keeps.
    group_size_redundancy: int = bounded(0, ge=0)
    #: With group_size_redundancy > 0. seat_order: a group keeps the episodes of its first group_size seats in
    #: launch order; a redundant seat only replaces a seat whose episode failed (env_error) or was given back,
    #: so which episodes are kept does not depend on their length (unbiased). first_finished: the first
    #: group_size episodes to finish, which biases each group toward short episodes (and whatever outcome
    #: correlates with length) in exchange for less waiting on the slowest seat.
    redundancy_keep: RedundancyKeep = "seat_order"
    #: Env tags (keys of custom_envs) this manager plays.
    tags: list[str] = field(default_factory=list)
    #: Groups per tag, same length as ``tags``; empty means split num_env_groups evenly.
    num_groups_partition: list[int] = field(default_factory=list)
    #: Most env instances one EnvManagerWorker process runs; more envs start more workers.
    max_env_num_per_worker: int = bounded(16, ge=1)
    #: Seconds an env reset or step may take before the episode ends as env_error.
    env_step_timeout_s: float = bounded(60.0, gt=0, note="seconds")
    #: Threads per worker for synchronous env reset/step calls.
    env_threads_per_worker: int = 8
    #: EnvManagerWorker processes: allocations between young garbage collections, after freezing what the
    #: worker built (roll_async/runtime/gc_tuning.py); 0 keeps Python's default (700).
    worker_gc_threshold: int = bounded(250_000, ge=0, note="(0 keeps Python's default)")
    #: Linux scheduling policy of the EnvManagerWorker and GroupQueueActor processes (roll_async/runtime/sched_policy.py):
    #: batch (SCHED_BATCH: same CPU share, but their wake-ups do not preempt vLLM's steps on a shared core) | normal.
    rollout_sched_policy: RolloutSchedPolicy = "batch"
    #: Ray CPUs reserved by each EnvManagerWorker actor.
    num_cpus_per_worker: float = 0.0
    #: spread: Ray's SPREAD strategy puts workers on as many nodes as it can; pack: Ray's default (the driver's
    #: node first). With num_cpus_per_worker > 0, each worker also holds its CPUs wherever it lands.
    worker_placement: WorkerPlacement = "spread"
    #: Group filter (see roll_async.scheduler.filters): none keeps every group; zero_variance drops groups whose rewards are all equal.
    group_filter: GroupFilterName = "none"
    #: An env that makes no progress for this long is reported by the watchdog.
    watchdog_timeout_s: float = 300.0
    #: EnvManagerWorkers that die (process killed, crash) are restarted this many times in total; one more fails the run.
    max_worker_restarts: int = bounded(3, ge=0)
    #: Train only. fifo: serve the oldest groups (no bias to short episodes; envs may idle behind a slow group).
    #: first_complete: serve the first groups to complete; the rest continue into later steps within the
    #: staleness bound, and every env group is kept busy (see roll_async.scheduler.serve_order).
    serve_order: ServeOrder = "fifo"
    #: Validation only: an env-config parquet (roll-async make-env-dataset) with the fixed val episodes.
    dataset: str | None = None


@dataclass
class LoraConfig:
    """LoRA adapters (peft) on the built-in trainer's model: only the adapters train, checkpoint and sync."""

    #: Adapter rank; 0 turns LoRA off (full fine-tuning).
    rank: int = bounded(0, ge=0, note="(0 turns LoRA off)")
    #: LoRA alpha: the adapter's update is scaled by alpha / rank.
    alpha: float = 16.0
    #: Adapter dropout; must be 0 (the trainer switches dropout off so PPO ratios compare the same policy).
    dropout: float = 0.0
    #: Names of the modules (last name part, as in peft) that get adapters, e.g. q_proj, v_proj, gate_proj.
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    #: What a weight sync sends: adapter (the adapter alone; the engines serve it as a vLLM LoRA request and
    #: keep older versions loaded for requests in flight) or merged (base + adapter merged into full weights,
    #: synced like full fine-tuning; for engines that cannot serve LoRA).
    sync: LoraSync = "adapter"


@dataclass
class TrainerConfig:
    """GRPO-style policy-gradient training of the same HF model the engine serves."""

    #: Dotted path ``package.module:Class`` of a custom Trainer; empty means the built-in GRPO trainer.
    trainer_cls: str = ""
    #: Torch device of the trainer: auto (CUDA if available, else CPU), cpu, cuda, cuda:N.
    device: str = "auto"
    #: The trainer's weight and AdamW-state dtype. The built-in trainer needs float32: pure bfloat16/float16
    #: AdamW loses updates below the weights' precision (at lr 1e-6 almost no weight changes); for bf16 compute
    #: set param_dtype=bfloat16 instead (float32 master weights).
    dtype: TrainerDtype = "float32"
    #: Compute dtype of the built-in trainer's forward and backward passes (torch.autocast; CPU supports
    #: bfloat16). Weights and optimizer state stay float32, so a bfloat16 setting still learns at small lr.
    param_dtype: TrainerParamDtype = "float32"
    #: AdamW learning rate.
    lr: float = bounded(1e-5, gt=0)
    #: Linear warm-up: training step s (0-based) uses lr * min(1, (s + 1) / lr_warmup_steps). AdamW's first
    #: steps move every weight by about lr whatever its gradient, which can undo a fresh warm start; 0: none.
    lr_warmup_steps: int = bounded(0, ge=0)
    #: AdamW weight decay.
    weight_decay: float = 0.0
    #: AdamW betas (two values).
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    #: Gradient norm clip per optimizer step.
    max_grad_norm: float = 1.0
    #: Trajectories per forward/backward pass; gradients accumulate over the batch.
    micro_batch_size: int = bounded(8, ge=1)
    #: 0: micro_batch_size rows per forward/backward pass, padded to the longest. > 0: rows grouped so each
    #: pass holds at most this many tokens (micro_batch_size ignored), packed end to end without padding where
    #: the model supports it, else padded (vision-language models). At least sequence_length.
    max_tokens_per_micro_batch: int = bounded(
        0, ge=0, note="(0: trainer.micro_batch_size rows per pass)"
    )
    #: Optimizer passes over each rollout batch (PPO epochs).
    ppo_epochs: int = 1
    #: grpo: (r - mean) / std within a group; rloo: leave-one-out baseline.
    advantage_estimator: AdvantageEstimator = "grpo"
    #: Divide group-relative advantages by the group's reward std (false: mean-centred only).
    normalize_advantage_std: bool = True
    #: PPO clip: the ratio pi_train/pi_behaviour is clipped below at 1 - clip_ratio_low.
    clip_ratio_low: float = 0.2
    #: PPO clip: the ratio is clipped above at 1 + clip_ratio_high (DAPO's clip-higher).
    clip_ratio_high: float = 0.28
    #: Truncated importance sampling cap on pi_train/pi_behaviour (off-policy correction); 0 disables.
    tis_cap: float = bounded(2.0, ge=0)
    #: KL penalty to the initial (reference) policy; 0 disables and loads no reference model.
    kl_coef: float = bounded(0.0, ge=0)
    #: token_mean: mean over all response tokens of the batch; seq_mean: mean of per-sequence means.
    loss_agg: LossAgg = "token_mean"
    #: Recompute activations in the backward pass (less memory, more compute).
    gradient_checkpointing: bool = False
    #: Drop from the loss tokens sampled by weights more than this many versions older than the
    #: trainer's current ones (per-token versions; -1 disables). Masked share: train/token_lag/masked_fraction.
    max_token_lag: int = bounded(-1, ge=-1, note="(-1: off; else a lag in versions)")
    #: > 0: no model is trained; each step takes this many seconds without CPU and the version advances
    #: (roll_async.trainer.simulated, SkyRL-style), for measuring the rollout side and async overlap.
    simulate_step_s: float = bounded(0.0, ge=0)
    #: With simulate_step_s: seconds each weight sync takes (engines paused as for a real sync; no weights move).
    simulate_sync_s: float = bounded(0.0, ge=0)
    #: Where the trainer runs: ``driver`` (in the pipeline's process, on ``device``) or ``ray_actor`` (a Ray actor
    #: holding ``num_gpus`` GPUs that Ray assigns; weights go from it to the engines through the object store).
    placement: TrainerPlacement = "driver"
    #: ray_actor only: GPUs the trainer actor reserves (fractions allowed); 0 trains on the actor's CPU.
    num_gpus: float = bounded(0.0, ge=0)
    #: single: one process holds the whole model (placement says where). fsdp2: ``num_ranks`` SPMD ranks, each a
    #: Ray actor in one placement group, shard parameters, gradients and AdamW state with torch FSDP2
    #: (roll_async.trainer.ranks); placement and num_gpus are for single only.
    strategy: TrainerStrategy = "single"
    #: fsdp2: the number of ranks (world size). Ray packs them onto as few nodes as hold them.
    num_ranks: int = bounded(1, ge=1)
    #: fsdp2: GPUs per rank (1 on GPU nodes; 0 trains on CPU with gloo, as the CPU tests do).
    gpus_per_rank: float = bounded(0.0, ge=0)
    #: fsdp2: dtype of the gradient reduce-scatter between ranks (FSDP2's MixedPrecisionPolicy.reduce_dtype).
    reduce_dtype: TrainerParamDtype = "float32"
    #: fsdp2: seconds one call on the ranks (join, train step, weight gather, checkpoint) may wait for every
    #: rank's answer; past it the ranks are stopped and the run fails naming the silent ones (0: no deadline).
    #: torch.distributed's timeout covers only collectives, so nothing else bounds a rank hung elsewhere (a
    #: deadlock, a stuck filesystem). 3600 is far above a slow but healthy step or checkpoint of a large model
    #: (minutes); lower it to catch hangs sooner.
    rank_call_timeout_s: float = bounded(
        3600.0,
        ge=0,
        note="seconds; set it above the slowest healthy train step or checkpoint, or 0 to wait on the ranks without a deadline",
    )
    #: LoRA adapters instead of full fine-tuning (rank > 0); with kl_coef > 0 the reference is the base model
    #: with the adapters off (no second copy of the weights).
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class WeightSyncConfig:
    """When the trainer's weights reach the engines, and what happens to turns in flight then."""

    #: Push trainer weights to the engine every this many steps. Sync mode needs 1 (on-policy); async mode
    #: counts staleness in the versions the engines served, so it needs max_staleness >= interval - 1.
    interval: int = bounded(1, ge=1)
    #: Async mode, what happens to turns in flight during an update: abort (and regenerate), wait, keep.
    in_flight: InFlightPolicy = "abort"


@dataclass
class SFTWarmupConfig:
    """Brief supervised warm start on env-solver demonstrations (the offline learning demo)."""

    #: Run the warm start before the first RL step.
    enabled: bool = False
    #: Demonstrations (solver episodes on seeds disjoint from the rollout's) to train on.
    num_demos: int = 64
    #: Fraction of each demo's turns that are kept (partial demos keep initial success low).
    demo_fraction: float = bounded(0.5, ge=0, le=1)
    #: Who plays the demos: expert (the env's solver, or a game's heuristic player) or random (a game with
    #: seats only: its random player on every seat, so the model learns the answer format and legal moves
    #: but no strategy, and RL starts from a policy that still explores every move).
    demonstrator: Literal["expert", "random"] = "expert"
    #: Optimizer steps of the warm start.
    steps: int = 50
    #: Learning rate of the warm start.
    lr: float = 1e-3
    #: Demonstrations per warm-start step.
    batch_size: int = 8


@dataclass
class CheckpointConfig:
    """Trainer checkpoints in RUN_DIR/checkpoints/, and resuming from one."""

    #: Save every this many steps (0: only at the end).
    save_interval: int = 0
    #: Keep this many most recent checkpoints.
    keep_last: int = 2
    #: A run directory (or its checkpoints/step_N) to continue from.
    resume_from: str | None = None
    #: Also write a Hugging Face model directory (RUN_DIR/hf/step_N, what ``roll-async export`` writes) every
    #: this many steps and at the end (0: never during the run).
    export_hf_interval: int = bounded(0, ge=0, note="(0: no export during the run)")


@dataclass
class LoggingConfig:
    """What a run prints and writes besides RUN_DIR/metrics.jsonl."""

    #: Print one line per step.
    console: bool = True
    #: Show a progress bar of the steps.
    progress_bar: bool = True
    #: Write TensorBoard event files to RUN_DIR/tensorboard/.
    tensorboard: bool = False
    #: Log metrics to Weights & Biases.
    wandb: bool = False
    #: Weights & Biases project name.
    wandb_project: str = "roll-async"
    #: Write trajectories.jsonl (with decoded text) in the run directory.
    save_trajectories: bool = True
    #: Console level of roll-async's own messages (INFO adds start-up lines); vLLM, Ray and transformers reach
    #: the console only at ERROR. Everything at INFO and above goes to RUN_DIR/logs/ (roll_async.run_output.logs).
    level: str = "WARNING"
    #: Write each step's collated training batch to RUN_DIR/batches/ (replay it with replay.from=RUN_DIR).
    save_batches: bool = False


@dataclass
class ReplayConfig:
    """Train on the batches a run saved (logging.save_batches) instead of rolling out: no engine, no env, no Ray.

    Written ``replay.from=RUN_DIR`` (``from`` is the user-facing name of ``from_dir``).
    """

    #: A run directory whose batches/ to train on (written replay.from).
    from_dir: str | None = None


@dataclass
class PipelineConfig:
    """The top level of a config file: the run's shape, and one key per section."""

    #: sync: every group is rolled out with the weights of the step it serves; async: rollout runs ahead of training.
    mode: Mode = "sync"
    #: Async only: how many steps a group may lag the consuming step. None means 1 in async mode.
    max_staleness: int | None = None
    #: Trajectories per training step (a multiple of train_env_manager.group_size).
    rollout_batch_size: int = 16
    #: Most tokens of one trajectory (prompt and every turn); an episode that reaches it ends.
    sequence_length: int = bounded(1024, ge=2, note="tokens")
    #: Training steps of the run.
    max_steps: int = 10
    #: Rollout pipeline: how many batches to collect.
    num_batches: int = bounded(2, ge=1)
    #: Run validation every this many steps (0: never).
    eval_steps: int = 0
    #: With eval_steps > 0: also validate once before the first step (logged as step start-1), on the same episodes.
    eval_at_start: bool = False
    #: Run seed: every env group's seed derives from it (and the SFT warm start's demo seeds).
    seed: int = 42
    #: Run directory; None means runs/<train|rollout>-<timestamp>.
    output_dir: str | None = None
    #: A Ray cluster to join (e.g. auto); None starts a local Ray instance.
    ray_address: str | None = None
    #: CPUs of the local Ray instance; None means the machine's core count.
    ray_num_cpus: int | None = None
    #: The model (see the model section).
    model: ModelConfig = field(default_factory=ModelConfig)
    #: The engine replicas (see the engine section).
    engine: EngineConfig = field(default_factory=EngineConfig)
    #: Sampling and request retries (see the generation section).
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    #: The training rollout's env groups (see the env manager section).
    train_env_manager: EnvManagerConfig = field(default_factory=EnvManagerConfig)
    #: The validation env groups (see the env manager section); num_env_groups=0 disables validation.
    val_env_manager: EnvManagerConfig = field(
        default_factory=lambda: EnvManagerConfig(num_env_groups=0, group_size=1)
    )
    #: Env definitions by tag (see the custom_envs.<Tag> section).
    custom_envs: dict[str, CustomEnvConfig] = field(default_factory=dict)
    #: The trainer (see the trainer section).
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    #: Weight pushes to the engines (see the weight_sync section).
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    #: Supervised warm start (see the sft_warmup section).
    sft_warmup: SFTWarmupConfig = field(default_factory=SFTWarmupConfig)
    #: Checkpoints and resuming (see the checkpoint section).
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    #: Console and run-directory output (see the logging section).
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    #: Training on saved batches (see the replay section).
    replay: ReplayConfig = field(default_factory=ReplayConfig)

    @property
    def staleness_bound(self) -> int:
        """Steps a training group may lag: 0 in sync mode, else max_staleness (None: 1); resolved in one place."""
        return staleness_bound(self.mode, self.max_staleness)


def staleness_bound(mode: Mode, max_staleness: int | None) -> int:
    """Steps a group may lag the step that trains on it: the one place that resolves it.

    0 in sync mode (every group is for the step it serves), else ``max_staleness`` (None means 1). The
    rollout spec carries the result; the queue, its lookahead and the engines' adapter count read it.
    """
    if mode == "sync":
        return 0
    return 1 if max_staleness is None else max_staleness
