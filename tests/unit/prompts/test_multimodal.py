"""Images in token-in/token-out rollouts: expansion once, token-exact turns, no half images, env errors.

Uses the offline tiny vision-language model's processor (built once, ~30 s; no engine).
"""

from __future__ import annotations

import asyncio

import pytest
from PIL import Image

from roll_async.config.schema import CustomEnvConfig, GenerationConfig, PipelineConfig
from roll_async.env_managers.env_manager import EnvManager, EnvManagerSettings
from roll_async.envs import make_env
from roll_async.errors import ConfigError, VisionInputError
from roll_async.pipelines.preflight import check_vision
from roll_async.prompts.images import (
    ExpandedObservation,
    ObservationEncoder,
    VisionProcessor,
    compact_prompt,
)
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.prompts.tokenizers import load_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.trajectory import EpisodeSpec


@pytest.fixture(scope="module")
def vl_model_path() -> str:
    from roll_async.model.tiny_vl import build_tiny_vl_model

    return str(build_tiny_vl_model())


@pytest.fixture(scope="module")
def vision(vl_model_path) -> VisionProcessor:
    return VisionProcessor.load(vl_model_path)


@pytest.fixture(scope="module")
def builder(vl_model_path) -> ChatPromptBuilder:
    return ChatPromptBuilder(load_tokenizer(vl_model_path), "You solve puzzles.")


def test_three_turn_ids_equal_the_processor_on_the_whole_conversation(vision, builder):
    """Incremental ids (expand each observation once, append) == the processor run on the full render."""
    env = make_env("sokoban", {"render_mode": "vision", "dim_room": [6, 6]})
    encoder = ObservationEncoder(vision)
    observation, info = env.reset(seed=5)
    first_text = info["instruction"] + "\n" + encoder.text(observation)
    first = encoder.encode(builder.first_turn_ids(first_text), observation)
    ids, images = list(first.token_ids), list(first.images)
    messages = [
        {"role": "system", "content": "You solve puzzles."},
        {"role": "user", "content": first_text},
    ]
    for action in ["<answer>Up</answer>", "<answer>Left</answer>"]:
        reply = builder.encode(action) + [builder.tokenizer.eos_token_id]
        ids += reply
        observation, *_ = env.step(action)
        text = encoder.text(observation)
        delta = encoder.encode(
            builder.closure_ids_after(reply) + builder.user_delta_ids(text), observation
        )
        ids += delta.token_ids
        images += delta.images
        messages += [
            {"role": "assistant", "content": action},
            {"role": "user", "content": text},
        ]
    rendered = builder.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    whole = vision.processor(
        text=[rendered], images=[images], add_special_tokens=False
    )["input_ids"][0]
    assert len(images) == 3
    assert ids == [int(i) for i in whole]


def test_expand_records_spans_and_compact_prompt_inverts_it(vision):
    image = Image.new("RGB", (96, 96), (10, 200, 30))
    ids = [7, vision.image_token_id, 8, 9, vision.image_token_id]
    expanded = vision.expand(ids, [image, image])
    assert len(expanded.spans) == 2
    for start, end in expanded.spans:
        assert expanded.token_ids[start:end] == vision.image_ids(image)
        assert vision.image_token_id in expanded.token_ids[start:end]
    assert (
        compact_prompt(expanded.token_ids, expanded.spans, vision.image_token_id) == ids
    )


def test_fit_never_cuts_an_image_in_half():
    obs = ExpandedObservation(
        [1, 2, 10, 11, 12, 3, 20, 21, 22], images=["a", "b"], spans=[(2, 5), (6, 9)]
    )
    assert obs.fit(9).token_ids == obs.token_ids
    cut = obs.fit(7)  # the second image (6..9) does not fit whole: cut before it
    assert (
        cut.token_ids == [1, 2, 10, 11, 12, 3]
        and cut.images == ["a"]
        and cut.spans == [(2, 5)]
    )
    cut = obs.fit(3)  # inside the first image: nothing of it is kept
    assert cut.token_ids == [1, 2] and cut.images == [] and cut.spans == []


def test_placeholder_count_mismatch_and_unprocessable_image_are_vision_input_errors(
    vision,
):
    with pytest.raises(VisionInputError, match="1 image.*0 image placeholder"):
        vision.expand([1, 2, 3], [Image.new("RGB", (32, 32))])
    with pytest.raises(VisionInputError, match="rejected an observation image"):
        vision.expand([vision.image_token_id], ["not an image"])


class _OneEpisode:
    """A scheduler that hands out one episode and keeps what comes back."""

    def __init__(self) -> None:
        self.spec = EpisodeSpec(
            tag="t", group_id=0, episode_id=0, seed=1, created_step=0
        )
        self.trajectories = []

    async def next_episode(self, env_id):
        spec, self.spec = self.spec, None
        return spec

    async def put_trajectory(self, trajectory):
        self.trajectories.append(trajectory)


@pytest.mark.parametrize(
    ("render_mode", "with_vision", "reason"),
    [
        (
            "vision",
            False,
            "render_mode is text but the env returned an observation with 1 image",
        ),
        (
            "text",
            True,
            "render_mode is vision but the env returned an observation without an image",
        ),
    ],
)
async def test_wrong_image_mode_is_a_counted_env_error_not_a_crash(
    vision, builder, render_mode, with_vision, reason
):
    custom = CustomEnvConfig(
        env_type="sokoban", env_config={"render_mode": render_mode}
    )
    scheduler = _OneEpisode()
    manager = EnvManager(
        0,
        EnvManagerSettings(
            tag="t",
            custom_env=custom,
            sequence_length=1024,
            generation=GenerationConfig(),
        ),
        make_env=lambda cfg: make_env("sokoban", cfg),
        scheduler=scheduler,
        engine=FakeEngine(),
        prompt_builder=builder,
        observations=ObservationEncoder(vision if with_vision else None),
    )
    await asyncio.wait_for(manager.run_rollout_loop(), 60)
    (trajectory,) = scheduler.trajectories
    assert trajectory.stop_reason == "env_error" and reason in trajectory.error
    assert manager.stats.env_errors == 1


def _vision_config(model_path: str | None, **engine_kwargs) -> PipelineConfig:
    from roll_async.config.schema import load_config

    overrides = [f"model.path={model_path}"] if model_path else ["model.path=null"]
    config = load_config("configs/sokoban_vision.yaml", overrides)
    config.engine.engine_kwargs.update(engine_kwargs)
    return config


def test_preflight_rejects_a_text_model_for_a_vision_config(tiny_model_path):
    with pytest.raises(
        ConfigError,
        match=r"custom_envs.VisionSokoban.env_config.render_mode=vision needs a vision-language model",
    ):
        check_vision(_vision_config(str(tiny_model_path)), str(tiny_model_path))


def test_preflight_rejects_a_processor_that_cannot_load(tmp_path, vl_model_path):
    import shutil

    broken = tmp_path / "vl"
    shutil.copytree(vl_model_path, broken)
    (broken / "processor_config.json").unlink()
    with pytest.raises(
        ConfigError, match="image processor .* cannot be loaded offline"
    ):
        check_vision(_vision_config(str(broken)), str(broken))


def test_preflight_rejects_an_image_limit_below_the_episode(vl_model_path):
    config = _vision_config(vl_model_path, limit_mm_per_prompt={"image": 3})
    with pytest.raises(
        ConfigError, match=r"limit_mm_per_prompt.image=3 is below the 7 images"
    ):
        check_vision(config, vl_model_path)
    check_vision(
        _vision_config(vl_model_path), vl_model_path
    )  # the shipped config passes


def test_run_directory_keeps_png_images_and_num_images(tmp_path):
    import json

    from roll_async.run_output.run_dir import RunDirectory
    from roll_async.trajectory import Trajectory, TurnRecord

    images = [Image.new("RGB", (48, 48), (i * 60, 0, 0)) for i in range(2)]
    trajectory = Trajectory(
        tag="v",
        group_id=0,
        episode_id=0,
        env_id=0,
        seed=1,
        traj_id="v-g0-e0",
        created_step=0,
    )
    trajectory.images, trajectory.image_spans = images, [(0, 7), (9, 16)]
    trajectory.turns = [
        TurnRecord(0, "a", "<image>", 0.0, 2, 0, 0.1, 0.01, num_images=1)
    ]
    run = RunDirectory(tmp_path)
    run.append_trajectories([trajectory])
    record = json.loads(run.trajectories_path.read_text())
    assert record["num_images"] == 2 and record["turns"][0]["num_images"] == 1
    assert record["image_files"] == [
        "images/v-g0-e0/image0.png",
        "images/v-g0-e0/image1.png",
    ]
    saved = Image.open(tmp_path / record["image_files"][1])
    assert saved.size == (48, 48) and saved.getpixel((5, 5)) == (60, 0, 0)


def test_unavailable_vl_family_names_the_working_one():
    from roll_async.model.tiny_vl import build_tiny_vl_family

    with pytest.raises(SystemExit, match="torchvision.*--family idefics3_vl"):
        build_tiny_vl_family("qwen2_5_vl")
    assert build_tiny_vl_family("qwen2_5") is None  # a text family is built elsewhere


def test_image_token_is_input_only_for_vl_models(
    vl_model_path, tiny_model_path, vision
):
    from roll_async.prompts.images import input_only_token_ids

    assert input_only_token_ids(vl_model_path) == [vision.image_token_id]
    assert input_only_token_ids(str(tiny_model_path)) == []


class _ExpandingFakeEngine(FakeEngine):
    """A fake engine that reports the prompt length vLLM would after expanding each image token."""

    def __init__(self, ids_per_image: int) -> None:
        super().__init__(tokens_per_request=4)
        self.ids_per_image = ids_per_image
        self.requests = []

    async def generate(self, request):
        self.requests.append(request)
        result = await super().generate(request)
        images = len((request.multi_modal_data or {}).get("image", []))
        result.num_prompt_tokens += images * (self.ids_per_image - 1)
        return result


async def test_sequence_length_never_cuts_an_image(vision, builder):
    ids_per_image = len(vision.image_ids(Image.new("RGB", (64, 64))))
    custom = CustomEnvConfig(
        env_type="sokoban",
        env_config={"render_mode": "vision"},
        max_steps=3,
        max_tokens_per_step=4,
    )
    first_len = None
    dropped_images = 0
    for extra in range(4, 100, 3):
        engine = _ExpandingFakeEngine(ids_per_image)
        scheduler = _OneEpisode()
        length = (first_len or 2048) + extra
        manager = EnvManager(
            0,
            EnvManagerSettings(
                tag="t",
                custom_env=custom,
                sequence_length=length,
                generation=GenerationConfig(),
            ),
            make_env=lambda cfg: make_env("sokoban", cfg),
            scheduler=scheduler,
            engine=engine,
            prompt_builder=builder,
            observations=ObservationEncoder(vision),
        )
        await asyncio.wait_for(manager.run_rollout_loop(), 60)
        (trajectory,) = scheduler.trajectories
        # first pass: learn the first prompt's length, then sweep cuts through turn 2's image
        if first_len is None:
            first_len = trajectory.prompt_length
            continue
        assert len(trajectory.token_ids) <= length
        assert trajectory.token_ids.count(vision.image_token_id) == 4 * len(
            trajectory.images
        )
        for _start, end in trajectory.image_spans:
            assert end <= len(trajectory.token_ids)
        # Every request carried exactly the images whose whole spans were in its prompt.
        for request in engine.requests:
            assert request.prompt_token_ids.count(vision.image_token_id) == len(
                request.multi_modal_data["image"]
            )
        if (
            len(trajectory.images) < trajectory.num_turns + 1
            and trajectory.stop_reason != "env_error"
        ):
            assert trajectory.stop_reason == "max_length"
            # the cut fell inside the next image
            dropped_images += len(trajectory.token_ids) < length
    assert dropped_images > 0  # the sweep really cut through an image
