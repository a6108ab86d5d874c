"""Images in a token-in/token-out conversation: expand once, never re-render.

The trainer must score exactly the ids the engine saw, but a model's processor
turns each image into many ids and vLLM expands images itself; so each image is
expanded once into the trajectory by the model's own processor, and the engine
gets a compact form whose expansion gives those same ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roll_async.config.sections import CustomEnvConfig
from roll_async.errors import VisionInputError
from roll_async.trajectory import Trajectory


@dataclass
class ExpandedObservation:
    """Ids of one observation delta with every image expanded; spans are relative to ``token_ids``."""

    token_ids: list[int]
    images: list[Any] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)

    def fit(self, room: int) -> ExpandedObservation:
        """The first ``room`` ids, cut before any image that would not fit whole (never half an image)."""
        cut = max(0, room)
        for start, end in self.spans:
            if end > cut:
                cut = min(cut, start)
                break
        kept = [(i, span) for i, span in enumerate(self.spans) if span[1] <= cut]
        return ExpandedObservation(
            self.token_ids[:cut],
            [self.images[i] for i, _ in kept],
            [span for _, span in kept],
        )


def observation_text(observation: Any) -> str:
    """Text of an observation: a str, or an object with ``.text`` (roll_async.envs.base.Observation)."""
    if isinstance(observation, str):
        return observation
    text = getattr(observation, "text", None)
    return text if isinstance(text, str) else str(observation)


def observation_images(observation: Any) -> list[Any]:
    """The images an observation carries (a plain str carries none)."""
    images = getattr(observation, "images", None)
    return list(images) if images else []


def check_observation_mode(observation: Any, vision: bool) -> None:
    """An image in text mode or none in vision mode is the env's mistake (an env_error, not a crash)."""
    images = observation_images(observation)
    if vision and not images:
        raise VisionInputError(
            "render_mode is vision but the env returned an observation without an image"
        )
    if not vision and images:
        raise VisionInputError(
            f"render_mode is text but the env returned an observation with {len(images)} image(s); "
            "set env_config.render_mode: vision and a vision-language model.path"
        )


def _model_config(model_path: str) -> dict[str, Any]:
    config_file = Path(model_path) / "config.json"
    return json.loads(config_file.read_text()) if config_file.is_file() else {}


def model_is_vision_language(model_path: str) -> bool:
    """True when the model's config names a vision tower (HF VL configs carry ``vision_config``)."""
    return "vision_config" in _model_config(model_path)


def input_only_token_ids(model_path: str) -> list[int]:
    """Token ids a VL model must never generate: its image placeholder (``image_token_id``/``image_token_index``).

    A generated image token would be one more placeholder than images: vLLM's next prompt and the
    trainer's forward would both fail. Untrained (random-init) models sample it readily.
    """
    config = _model_config(model_path)
    if "vision_config" not in config:
        return []
    ids = {config.get("image_token_id"), config.get("image_token_index")}
    return sorted(int(i) for i in ids if isinstance(i, int))


def input_only_logit_bias(model_path: str) -> dict[int, float]:
    """The logit bias that keeps a VL model from generating its input-only tokens.

    The engine samples with it and the trainer scores with it (``SamplingSettings.logit_bias``):
    vLLM's processed logprobs include the bias, so both sides must apply the same one.
    """
    return {token_id: -100.0 for token_id in input_only_token_ids(model_path)}


class VisionProcessor:
    """The model's own processor, used once per observation image and again by the trainer.

    An env in ``render_mode: vision`` returns an :class:`~roll_async.envs.base.Observation`
    whose text holds one placeholder per image. The chat template renders that text
    like any other observation (the placeholder is the model's image token, a
    special token, so it is one id). Then :meth:`VisionProcessor.expand` replaces
    each image-token id by the ids the model's own processor produces for that
    image (for Idefics3: ``<fake_token_around_image><global-img>`` + N x
    ``<image>`` + ``<fake_token_around_image>``). Those expanded ids are appended to
    the trajectory once and are what the trainer scores; the image's span in the
    trajectory is recorded next to the image.

    The trainer gets the same images (``Trajectory.images``) and runs the same
    processor's image part to get pixel values (:meth:`VisionProcessor.pixel_inputs`).
    """

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.image_token: str = processor.image_token
        self.image_token_id: int = int(
            self.tokenizer.convert_tokens_to_ids(self.image_token)
        )

    @classmethod
    def load(cls, model_path: str, trust_remote_code: bool = False) -> VisionProcessor:
        """Load the processor from a local model directory (no hub access: ``local_files_only``)."""
        from transformers import AutoProcessor  # heavy: loaded only for vision models

        processor = AutoProcessor.from_pretrained(
            model_path, trust_remote_code=trust_remote_code, local_files_only=True
        )
        if (
            getattr(processor, "image_token", None) is None
            or getattr(processor, "image_processor", None) is None
        ):
            raise VisionInputError(
                f"the processor of {model_path!r} ({type(processor).__name__}) has no image processor/image token"
            )
        return cls(processor)

    # -- rollout side ------------------------------------------------------------------

    def placeholder_text(self, text: str, env_placeholder: str) -> str:
        """Observation text with the env's placeholder replaced by the model's image token."""
        return (
            text
            if env_placeholder == self.image_token
            else text.replace(env_placeholder, self.image_token)
        )

    def image_ids(self, image: Any) -> list[int]:
        """The ids the processor puts in place of one image token for ``image``."""
        try:
            out = self.processor(
                text=[self.image_token], images=[[image]], add_special_tokens=False
            )
        except Exception as exc:
            # PIL/numpy/processor errors: one image the processor cannot take
            raise VisionInputError(
                f"the model's processor rejected an observation image: {type(exc).__name__}: {exc}"
            ) from exc
        return [int(i) for i in out["input_ids"][0]]

    def expand(self, token_ids: list[int], images: list[Any]) -> ExpandedObservation:
        """Replace the i-th image-token id in ``token_ids`` by the expansion of ``images[i]``."""
        positions = [i for i, tok in enumerate(token_ids) if tok == self.image_token_id]
        if len(positions) != len(images):
            raise VisionInputError(
                f"the observation has {len(images)} image(s) but its text renders {len(positions)} "
                f"image placeholder(s) ({self.image_token!r}); put one placeholder per image in the text"
            )
        out: list[int] = []
        spans: list[tuple[int, int]] = []
        previous = 0
        for position, image in zip(positions, images):
            out.extend(token_ids[previous:position])
            expansion = self.image_ids(image)
            spans.append((len(out), len(out) + len(expansion)))
            out.extend(expansion)
            previous = position + 1
        out.extend(token_ids[previous:])
        return ExpandedObservation(out, list(images), spans)

    # -- trainer side ------------------------------------------------------------------

    def pixel_inputs(self, images_per_row: list[list[Any]]) -> dict[str, Any]:
        """Model inputs for a batch (e.g. ``pixel_values``, ``pixel_attention_mask``), rows padded with blank images.

        Rows without images get none; Idefics3 drops all-zero padding images itself.
        """
        if not any(images_per_row):
            return {}
        return dict(
            self.processor.image_processor(
                [list(row) for row in images_per_row], return_tensors="pt"
            )
        )


class ObservationEncoder:
    """What an EnvManager does with observations: text for the template, ids with images expanded once.

    Text mode (``vision is None``) is plain ids; an observation with images is an error there, and
    one without images is an error in vision mode (the EnvManager turns both into an ``env_error``).
    """

    def __init__(
        self, vision: VisionProcessor | None, env_placeholder: str = "<image>"
    ) -> None:
        self.vision = vision
        self.env_placeholder = env_placeholder

    def text(self, observation: Any) -> str:
        text = observation_text(observation)
        return (
            self.vision.placeholder_text(text, self.env_placeholder)
            if self.vision
            else text
        )

    def check(self, observation: Any) -> None:
        check_observation_mode(observation, self.vision is not None)

    def encode(self, token_ids: list[int], observation: Any) -> ExpandedObservation:
        """``token_ids`` (template output for this observation) with its images expanded by the processor."""
        self.check(observation)
        if self.vision is None:
            return ExpandedObservation(list(token_ids))
        return self.vision.expand(token_ids, observation_images(observation))

    def engine_prompt(
        self, trajectory: Trajectory
    ) -> tuple[list[int], dict[str, list[Any]] | None]:
        """The prompt ids and multimodal data a generate request carries for ``trajectory`` so far."""
        if self.vision is None or not trajectory.images:
            return list(trajectory.token_ids), None
        ids = compact_prompt(
            trajectory.token_ids, trajectory.image_spans, self.vision.image_token_id
        )
        return ids, {"image": list(trajectory.images)}


def is_vision_tag(custom_env: CustomEnvConfig) -> bool:
    """Whether a ``custom_envs.<tag>`` entry renders images (``env_config.render_mode: vision``)."""
    return dict(custom_env.env_config).get("render_mode") == "vision"


def observation_encoder(
    custom_env: CustomEnvConfig, vision: VisionProcessor | None
) -> ObservationEncoder:
    """The encoder for one tag: the VL processor in vision mode, plain text otherwise."""
    if not is_vision_tag(custom_env):
        return ObservationEncoder(None)
    if vision is None:
        raise VisionInputError(
            "a vision tag needs the model's VisionProcessor (none was loaded)"
        )
    return ObservationEncoder(
        vision, str(dict(custom_env.env_config).get("image_placeholder", "<image>"))
    )


def append_images(
    trajectory: Trajectory, offset: int, observation: ExpandedObservation
) -> None:
    """Record an appended observation's images and their spans (shifted to trajectory positions)."""
    trajectory.images.extend(observation.images)
    trajectory.image_spans.extend(
        (offset + start, offset + end) for start, end in observation.spans
    )


def compact_prompt(
    token_ids: list[int], spans: list[tuple[int, int]], image_token_id: int
) -> list[int]:
    """The engine's form of a prompt: each expanded image span collapsed to one image token (vLLM expands it).

    vLLM always applies its own placeholder expansion to a token prompt with
    multimodal data (given pre-expanded ids it expands again). So the engine request carries the
    *compact* form, :func:`compact_prompt`: each recorded span collapsed back to
    the single image token, plus all images so far in placeholder order. vLLM's
    expansion of that is the trajectory's ids again; the EnvManager checks the
    engine's prompt length against the trajectory on every turn, and the
    integration test checks the ids themselves.
    """
    out: list[int] = []
    previous = 0
    for start, end in spans:
        out.extend(token_ids[previous:start])
        out.append(image_token_id)
        previous = end
    out.extend(token_ids[previous:])
    return out


def save_trajectory_images(
    trajectory: Trajectory, directory: Path, relative_to: Path
) -> list[str]:
    """Write a trajectory's images as ``<directory>/<traj_id>/image<k>.png``; returns paths relative to the run."""
    folder = Path(directory) / trajectory.traj_id
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, image in enumerate(trajectory.images):
        path = folder / f"image{index}.png"
        image.save(path, format="PNG")
        paths.append(str(path.relative_to(relative_to)))
    return paths
