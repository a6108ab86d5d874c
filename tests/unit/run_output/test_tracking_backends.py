"""The real optional tracking backends: TensorBoard event files and a W&B offline run, written and read back."""

from __future__ import annotations

import glob
import json
import struct
import time

import pytest

from roll_async.config.schema import LoggingConfig
from roll_async.run_output.run_dir import RunDirectory
from roll_async.run_output.tracking import MetricsTracker

STEPS = [
    {"train/loss": 0.5, "rollout/tokens_per_s": 100.0},
    {"train/loss": 0.25, "rollout/tokens_per_s": 150.0},
]


def _log_steps(tracker: MetricsTracker) -> None:
    for step, metrics in enumerate(STEPS):
        tracker.log(step, metrics)
    tracker.close()


def test_tensorboard_event_files_hold_every_step(tmp_path):
    pytest.importorskip(
        "tensorboard", reason="pip install -e '.[test]' installs tensorboard"
    )
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = RunDirectory(tmp_path)
    _log_steps(MetricsTracker(LoggingConfig(tensorboard=True), run, {}))
    events = EventAccumulator(str(run.root / "tensorboard"))
    events.Reload()
    assert {"train/loss", "rollout/tokens_per_s"} <= set(events.Tags()["scalars"])
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
        (0, 0.5),
        (1, 0.25),
    ]


def _wandb_records(path: str):
    """Records of a .wandb file: a 7-byte ':W&B' header, then LevelDB-log framing (32 KiB blocks; full/first/middle/last)."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # block padding
            pos += left
            continue
        if pos + 7 + length > len(data):  # still being written
            return
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            yield pending
            pending = b""


@pytest.mark.slow
def test_wandb_offline_run_holds_every_step(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="pip install -e '.[test]' installs wandb")
    from wandb.proto import wandb_internal_pb2

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv(
        "WANDB__SERVICE_WAIT", "300"
    )  # wandb-core may start slowly on a loaded 2-core machine (default 30 s)
    run = RunDirectory(tmp_path)
    _log_steps(MetricsTracker(LoggingConfig(wandb=True), run, {"mode": "sync"}))
    (path,) = glob.glob(str(run.root / "wandb" / "offline-run-*" / "run-*.wandb"))
    deadline = time.monotonic() + 120
    # wandb-core's writer may still be flushing the file after finish() returned
    while True:
        history = []
        for raw in _wandb_records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "history":
                history.append(
                    {
                        item.key or "/".join(item.nested_key): json.loads(
                            item.value_json
                        )
                        for item in record.history.item
                    }
                )
        if len(history) >= len(STEPS) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert [
        (h["_step"], h["train/loss"], h["rollout/tokens_per_s"]) for h in history
    ] == [(0, 0.5, 100.0), (1, 0.25, 150.0)]
