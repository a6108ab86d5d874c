"""The train loop's phases on saved batches with the simulated trainer: no engine, env or Ray.

The loop is a batch source, the train step and the after-step actions in order
(roll_async.pipelines.agentic_pipeline); these runs check the order, what each phase
writes, and that a signal during the train step keeps and logs that step, checkpoints
it and skips the rest, as before the loop was split into phases.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from roll_async import metrics as m
from roll_async.config.schema import load_config
from roll_async.pipelines.agentic_pipeline import AgenticPipeline
from roll_async.pipelines.interrupt import RunInterrupted
from roll_async.pipelines.step_actions import (
    CheckpointAndExport,
    StepLog,
    Validation,
    WeightSync,
)
from roll_async.pipelines.step_state import RunProgress, StepBatch
from roll_async.trainer.batch_dump import save_batch
from roll_async.trainer.collate import collate_trajectories
from roll_async.trajectory import Trajectory

REPO = Path(__file__).resolve().parents[3]


def _saved_run(directory: Path, steps: list[int]) -> Path:
    """A run directory holding one saved batch for each of ``steps``."""
    trajectories = [
        Trajectory(
            tag="T",
            group_id=0,
            episode_id=i,
            env_id=i,
            seed=1,
            traj_id=f"T-g0-e{i}",
            created_step=0,
            token_ids=[1, 2, 3],
            response_mask=[0, 1, 1],
            logprobs=[0.0, -0.5, -0.5],
            episode_reward=float(i),
        )
        for i in range(2)
    ]
    batch = collate_trajectories(trajectories, pad_token_id=0)
    for step in steps:
        save_batch(directory / "batches", step, batch, trajectories)
    return directory


def _replay_config(tmp_path: Path, model: Path, saved: Path, *overrides: str):
    return load_config(
        REPO / "configs" / "sokoban.yaml",
        [
            f"model.path={model}",
            f"output_dir={tmp_path / 'out'}",
            f"replay.from={saved}",
            "max_steps=4",
            "trainer.simulate_step_s=0.01",
            "sft_warmup.enabled=false",
            "logging.progress_bar=false",
            "logging.console=false",
            *overrides,
        ],
    )


def _metrics(run: Path) -> list[dict]:
    return [
        json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
    ]


async def test_replay_runs_the_phases_until_the_saved_batches_end(
    tmp_path, tiny_model_path, caplog
):
    saved = _saved_run(tmp_path / "saved", [0, 1])
    config = _replay_config(
        tmp_path, tiny_model_path, saved, "checkpoint.save_interval=1"
    )
    run = await AgenticPipeline(config).run()
    rows = _metrics(run)
    assert [r["step"] for r in rows] == [0, 1]
    for row in rows:
        assert row[m.TIME_STEP_WEIGHT_SYNC] == 0.0  # replay moves no weights
        assert row["train/num_trajectories"] == 2.0
        assert row[m.TIME_STEP_TOTAL] >= row[m.TIME_STEP_TRAIN] > 0
        assert row["timestamp/train_start"] <= row["timestamp/train_end"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_0",
        "step_1",
    ]
    assert "has no batch for step 2; replay stops" in caplog.text


async def test_a_signal_during_the_train_step_keeps_logs_and_checkpoints_that_step(
    tmp_path, tiny_model_path
):
    saved = _saved_run(tmp_path / "saved", [0, 1, 2])
    config = _replay_config(tmp_path, tiny_model_path, saved)

    class SignalledPipeline(AgenticPipeline):
        """SIGTERM arrives while step 1 trains."""

        def _prepare_trainer(self):
            metrics = super()._prepare_trainer()
            train_step = self.trainer.train_step
            loop = self.interrupt._loop

            def signalled(batch, step):
                if step == 1:
                    loop.call_soon_threadsafe(self.interrupt._on_signal, signal.SIGTERM)
                return train_step(batch, step)

            self.trainer.train_step = signalled
            return metrics

    pipeline = SignalledPipeline(config)
    with pytest.raises(RunInterrupted) as caught:
        await pipeline.run(handle_signals=True)
    stopped = caught.value
    assert stopped.step == 2 and stopped.signal_name == "SIGTERM"
    assert stopped.checkpoint is not None and stopped.checkpoint.endswith("step_1")
    rows = _metrics(Path(stopped.run_dir))
    assert [r["step"] for r in rows] == [0, 1]
    # step 1 was trained and logged, but no weight sync ran after it
    assert m.TIME_STEP_WEIGHT_SYNC in rows[0] and m.TIME_STEP_WEIGHT_SYNC not in rows[1]


def test_the_after_step_actions_run_in_the_documented_order(tmp_path, tiny_model_path):
    saved = _saved_run(tmp_path / "saved", [0])
    pipeline = AgenticPipeline(_replay_config(tmp_path, tiny_model_path, saved))
    pipeline.run_dir = object()  # type: ignore[assignment]
    pipeline.tracker = object()  # type: ignore[assignment]
    actions = pipeline._after_step_actions(RunProgress(0), None)
    assert [type(a) for a in actions] == [
        WeightSync,
        Validation,
        CheckpointAndExport,
        StepLog,
    ]
    # only the log still runs for the step a signal arrived in; the long waits are raced
    assert [a.runs_when_stopping for a in actions] == [False, False, False, True]
    assert [a.interruptible for a in actions] == [True, True, False, False]


@pytest.mark.parametrize(
    "save_every, export_every, saved_steps, exported_steps",
    [
        (0, 0, [9], []),  # the last step always
        (3, 0, [2, 5, 8, 9], []),
        (0, 4, [3, 7, 9], [3, 7, 9]),  # an export needs its checkpoint
        (2, 4, [1, 3, 5, 7, 9], [3, 7, 9]),
    ],
)
async def test_checkpoint_and_export_follow_their_intervals(
    save_every, export_every, saved_steps, exported_steps
):
    config = load_config(
        REPO / "configs" / "sokoban.yaml",
        [
            f"checkpoint.save_interval={save_every}",
            f"checkpoint.export_hf_interval={export_every}",
        ],
    ).checkpoint
    saved: list[int] = []
    exported: list[int] = []

    async def checkpoint(step: int) -> None:
        saved.append(step)

    progress = RunProgress(0)
    action = CheckpointAndExport(config, 10, checkpoint, exported.append, progress)
    for step in range(10):
        record = StepBatch(step, None, [], {}, 0.0)  # type: ignore[arg-type]
        if action.due(record):
            await action(record)
    assert saved == saved_steps and exported == exported_steps
    assert progress.last_saved == 9
