"""The report page and trace from a run directory: rows per env instance, spans, fates, stragglers, staleness, no network."""

from __future__ import annotations

import json
import re

from roll_async.config.schema import config_to_yaml, load_config
from roll_async.report import load_report_data, write_report, write_trace
from roll_async.run_output.run_dir import RunDirectory
from roll_async.trajectory import EnvSpan, Trajectory, TurnRecord

T0 = 1_700_000_000.0


def _trajectory(
    env_id: int,
    group_id: int,
    start: float,
    seconds: float,
    created_step: int,
    version: int,
) -> Trajectory:
    turn = TurnRecord(
        turn=0,
        action_text="<answer>Up</answer>",
        observation="grid",
        reward=1.0,
        generated_tokens=5,
        weight_version=version,
        generate_s=seconds / 2,
        env_step_s=0.01,
        generate_started_at=start + 0.1,
        generate_finished_at=start + 0.1 + seconds / 2,
        env_step_started_at=start + 0.2 + seconds / 2,
        env_step_finished_at=start + seconds,
    )
    return Trajectory(
        tag="FrozenLake",
        group_id=group_id,
        episode_id=env_id,
        env_id=env_id,
        seed=5,
        traj_id=f"FrozenLake-g{group_id}-e{env_id}",
        created_step=created_step,
        token_ids=[1, 2, 3],
        response_mask=[0, 1, 1],
        logprobs=[0.0, -0.1, -0.2],
        turns=[turn],
        episode_reward=1.0,
        oldest_weight_version=version,
        newest_weight_version=version,
        started_at=start,
        finished_at=start + seconds,
        episode_requested_at=start - 0.5,
    )


class _Tokenizer:
    def decode(
        self, ids
    ):  # the run directory decodes the whole conversation for the browser
        return "<|im_start|>user\nFind the goal<|im_end|>\n<|im_start|>assistant\n<answer>Up</answer>"


def _make_run(tmp_path):
    config = load_config(
        "configs/frozen_lake.yaml",
        ["train_env_manager.num_env_groups=2", "rollout_batch_size=8"],
    )
    run = RunDirectory(tmp_path)
    run.write_config(config)
    served = [_trajectory(env_id, 0, T0 + env_id, 2.0, 0, 0) for env_id in range(4)]
    served.append(
        _trajectory(4, 1, T0, 20.0, 0, 1)
    )  # a straggler: 10x the median episode
    run.append_trajectories(served, _Tokenizer(), served_step=1, served_at=T0 + 25)
    error = _trajectory(5, 1, T0 + 1, 1.0, 1, 1)
    error.stop_reason, error.error = "env_error", "env.step raised RuntimeError: boom"
    run.append_unserved(
        [("env_error", error), ("dropped_stale", _trajectory(6, 2, T0 + 2, 2.0, 0, 0))],
        _Tokenizer(),
        step=1,
    )
    for step in range(2):
        run.append_metrics(
            step,
            {"rollout/trajectories_per_s": 1.0 + step, "train/loss": 0.5 - step / 10},
        )
    return run


def test_report_data_has_a_row_per_configured_env_and_every_fate(tmp_path):
    run = _make_run(tmp_path)
    data = load_report_data(run.root)
    # 2 groups x 4 envs from the config, including envs with no episode yet
    assert data.env_ids == list(range(8))
    assert data.kind == "train"
    fates = {e["traj_id"]: e["fate"] for e in data.episodes}
    assert sorted(fates.values()) == ["dropped_stale", "env_error"] + ["served"] * 5
    stragglers = [e["traj_id"] for e in data.episodes if e["straggler"]]
    assert stragglers == ["FrozenLake-g1-e4"]
    assert data.staleness == {1: 5}
    first = next(e for e in data.episodes if e["env_id"] == 0)
    # waiting for an episode, then the episode
    assert first["requested"] == 0.0 and first["start"] == 0.5
    assert (
        first["turns"][0]["gs"]
        < first["turns"][0]["gf"]
        <= first["turns"][0]["es"]
        < first["turns"][0]["ef"]
    )
    assert first["served"] > first["end"]  # queued for the trainer
    entry = next(t for t in data.trajectories if t["fate"] == "served")
    kinds = [s["kind"] for s in entry["segments"]]
    assert (
        kinds == ["context", "generated"]
        and entry["segments"][1]["text"] == "<answer>Up</answer>"
    )


def test_report_is_one_self_contained_file(tmp_path):
    run = _make_run(tmp_path)
    page = write_report(run.root).read_text()
    assert (run.root / "report.html").is_file()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page), (
        "the page must not load anything"
    )
    assert (
        "http://" not in page.replace("http://www.w3.org/2000/svg", "")
        and "https://" not in page
    )
    embedded = re.search(
        r'<script id="report-data" type="application/json">(.*?)</script>', page, re.S
    ).group(1)
    assert json.loads(embedded)["env_ids"] == list(range(8))


def test_trace_is_chrome_trace_json_with_one_track_per_env(tmp_path):
    run = _make_run(tmp_path)
    events = json.loads(write_trace(run.root).read_text())["traceEvents"]
    names = {
        e["args"]["name"]
        for e in events
        if e["name"] == "thread_name" and e["tid"] < 100_000
    }
    assert len(names) == 8
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["cat"] for e in spans} == {
        "waiting",
        "episode",
        "generate",
        "env_step",
        "queued",
    }
    assert all(e["dur"] >= 1 and e["ts"] >= 0 for e in spans)


def test_text_that_looks_like_html_cannot_break_the_page(tmp_path):
    run = _make_run(tmp_path)
    (run.root / "config.yaml").write_text(
        config_to_yaml(load_config("configs/frozen_lake.yaml"))
    )
    trajectory = _trajectory(0, 0, T0, 1.0, 0, 0)
    trajectory.turns[0].action_text = "</script><script>alert(1)</script>"
    run.append_trajectories([trajectory], served_step=0)
    page = write_report(run.root).read_text()
    # the data script and the page script; the text is escaped
    assert page.count("</script>") == 2


def test_generated_text_is_found_after_a_prompt_that_quotes_it():
    from roll_async.report.data import _segments

    record = {
        "text": "system: reply inside <answer></answer>\nuser: grid\nassistant: <answer>\nuser: invalid\nassistant: <answer>Up</answer>",
        "turns": [
            {"turn": 0, "action_text": "<answer>"},
            {"turn": 1, "action_text": "<answer>Up</answer>"},
        ],
    }
    generated = [
        (s["turn"], s["text"]) for s in _segments(record) if s["kind"] == "generated"
    ]
    assert generated == [(0, "<answer>"), (1, "<answer>Up</answer>")]
    context = "".join(s["text"] for s in _segments(record) if s["kind"] == "context")
    assert context.startswith(
        "system: reply inside <answer></answer>\nuser: grid\nassistant: "
    )


def test_both_seats_of_a_game_show_on_tracks_of_their_own(tmp_path):
    """Self-play gives one trajectory per trained seat of the same env and the same time span: the trace puts
    each seat on its own named track under its env, and the page's data carries the role for its sub-rows."""
    run = _make_run(tmp_path)
    seats = []
    for seat in (0, 1):
        t = _trajectory(7, 3, T0 + 3, 4.0, 1, 1)
        t.tag, t.role, t.opponents = "KuhnPoker", f"seat{seat}", "policy"
        t.traj_id = f"KuhnPoker-g3-e7-seat{seat}"
        seats.append(t)
    run.append_trajectories(seats, _Tokenizer(), served_step=2, served_at=T0 + 30)
    report = load_report_data(run.root)
    assert {e["role"] for e in report.episodes if e["env_id"] == 7} == {
        "seat0",
        "seat1",
    }
    assert {e["role"] for e in report.episodes if e["env_id"] != 7} == {""}
    events = json.loads(write_trace(run.root).read_text())["traceEvents"]
    tracks = {
        e["tid"]: e["args"]["name"]
        for e in events
        if e["name"] == "thread_name" and "seat" in e["args"]["name"]
    }
    assert sorted(tracks.values()) == [
        "env 7 FrozenLake seat0",
        "env 7 FrozenLake seat1",
    ]
    episodes = [
        e for e in events if e.get("cat") == "episode" and e["args"].get("role")
    ]
    assert {e["tid"] for e in episodes} == set(
        tracks
    )  # not stacked on env 7's own track
    assert {e["args"]["role"] for e in episodes} == {"seat0", "seat1"}
    html = write_report(run.root).read_text()
    assert "seatOf" in html and re.search(r'"role": ?"seat1"', html)


def test_an_envs_own_spans_reach_the_report_data_and_the_trace(tmp_path):
    config = load_config("configs/frozen_lake.yaml", ["rollout_batch_size=8"])
    run = RunDirectory(tmp_path)
    run.write_config(config)
    trajectory = _trajectory(0, 0, T0, 4.0, 0, 0)
    trajectory.env_spans = [
        EnvSpan("workspace_start", T0 + 0.01, T0 + 0.05),
        EnvSpan("exec", T0 + 2.2, T0 + 2.5, turn=0),
        EnvSpan("verify", T0 + 2.6, T0 + 3.9, turn=0),
    ]
    run.append_trajectories([trajectory], _Tokenizer(), served_step=1, served_at=T0 + 5)
    (episode,) = load_report_data(run.root).episodes
    # times relative to the run's first event: the episode was requested at T0 - 0.5
    assert episode["env_spans"] == [
        {"name": "workspace_start", "s": 0.51, "f": 0.55, "turn": -1},
        {"name": "exec", "s": 2.7, "f": 3.0, "turn": 0},
        {"name": "verify", "s": 3.1, "f": 4.4, "turn": 0},
    ]
    page = write_report(run.root).read_text()
    embedded = re.search(
        r'<script id="report-data" type="application/json">(.*?)</script>', page, re.S
    ).group(1)
    assert json.loads(embedded)["episodes"][0]["env_spans"] == episode["env_spans"]
    events = json.loads(write_trace(run.root).read_text())["traceEvents"]
    assert [e["name"] for e in events if e.get("cat") == "env_span"] == [
        "workspace_start",
        "exec",
        "verify",
    ]
