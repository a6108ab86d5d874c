"""Reading a config: YAML files with their ``defaults`` includes, ``key=value`` overrides, and clear errors.

Loading order: the YAML's ``defaults`` list (merged first to last), then the YAML itself, then the overrides.
An include is looked up next to the file that includes it, then in the repository's ready ``configs/`` (so
``defaults: [base]`` works from a config anywhere); a missing one fails listing every path tried. A key that
is not in the schema fails with a did-you-mean suggestion (or the sections where it exists), a wrong word
for a ``Literal`` key with its choices, and the loaded config then passes
:func:`~roll_async.config.validation.validate_config` before any actor starts.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from roll_async.config.field_checks import check_fields, did_you_mean
from roll_async.config.sections import CustomEnvConfig, PipelineConfig, RewardConfig
from roll_async.config.validation import validate_config
from roll_async.errors import ConfigError

#: The repository's ``configs/``, where ``defaults: [base]`` finds ``base.yaml`` from a config anywhere. It sits
#: next to the package in a source checkout (or an editable install); a wheel does not ship it.
SHIPPED_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _schema_keys(node: Any) -> list[str]:
    if dataclasses.is_dataclass(node):
        return [f.name for f in dataclasses.fields(node)]
    return []


def _load_yaml_with_defaults(path: Path, seen: tuple[Path, ...] = ()) -> DictConfig:
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(
            f"config file {str(path)!r} does not exist; pass a path to a YAML file, e.g. configs/sokoban.yaml"
        )
    if path in seen:
        raise ConfigError(
            f"config 'defaults' form a cycle through {str(path)!r}; remove one of the includes"
        )
    try:
        raw = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error_line(path, exc)) from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping at the top level"
        )
    defaults = raw.pop("defaults", [])
    merged = OmegaConf.create({})
    for entry in defaults:
        if entry == "_self_":
            continue
        base = _find_include(str(entry), path)
        # mappings merged into a mapping: a DictConfig
        merged = cast(
            DictConfig,
            OmegaConf.merge(merged, _load_yaml_with_defaults(base, seen + (path,))),
        )
    return cast(DictConfig, OmegaConf.merge(merged, raw))


def _find_include(entry: str, including: Path) -> Path:
    """The file a ``defaults`` entry names: next to ``including`` first, then in the shipped configs/."""
    name = Path(entry)
    if name.suffix not in (".yaml", ".yml"):
        name = name.with_suffix(".yaml")
    tried: list[
        Path
    ] = []  # one entry for an absolute name, or for a config inside configs/ itself
    for folder in (including.parent, SHIPPED_CONFIGS):
        candidate = (folder / name).resolve()
        if candidate not in tried:
            tried.append(candidate)
    for candidate in tried:
        if candidate.is_file():
            return candidate
    shipped = (
        ""
        if SHIPPED_CONFIGS.is_dir() or name.is_absolute()
        else f" (roll-async's configs/ is not in this install, only in a source checkout: {SHIPPED_CONFIGS})"
    )
    raise ConfigError(
        f"config {str(including)!r}: the include {entry!r} (defaults) was not found; looked for "
        f"{', '.join(repr(str(c)) for c in tried)}{shipped}. Put it next to the config or fix the name"
    )


def _yaml_error_line(path: Path, exc: yaml.YAMLError) -> str:
    """``file:line:column: YAML syntax error: problem`` (1-based, as editors count)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = (
        f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    )
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    return f"{where}: YAML syntax error: {problem}" + (
        f" ({context})" if context else ""
    )


def _sections_with_key(leaf: str, node: Any = None, prefix: str = "") -> list[str]:
    """Every dotted path in the schema whose last part is ``leaf`` (``custom_envs.<Tag>`` for env entries)."""
    node = PipelineConfig() if node is None else node
    found: list[str] = []
    for f in dataclasses.fields(node):
        path = f"{prefix}{f.name}"
        value = getattr(node, f.name)
        if f.name == leaf:
            found.append(path)
        if dataclasses.is_dataclass(value):
            found.extend(_sections_with_key(leaf, value, path + "."))
        elif f.name == "custom_envs":
            found.extend(
                _sections_with_key(
                    leaf, CustomEnvConfig(env_type="x"), path + ".<Tag>."
                )
            )
    return found


def _explain_unknown_key(exc: ConfigKeyError) -> ConfigError:
    full_key = getattr(exc, "full_key", None) or ""
    parts = full_key.split(".")
    node: Any = PipelineConfig()
    for part in parts[:-1]:
        if isinstance(node, dict):
            node = CustomEnvConfig()
            continue
        if isinstance(node, CustomEnvConfig) and part == "reward":
            node = RewardConfig()  # an optional section: None by default
            continue
        node = getattr(node, part, None)
    choices = _schema_keys(node)
    leaf = parts[-1]
    elsewhere = [p for p in _sections_with_key(leaf) if p != full_key]
    if elsewhere:
        where = "the top level" if len(parts) == 1 else f"'{'.'.join(parts[:-1])}'"
        return ConfigError(
            f"unknown config key '{full_key}': '{leaf}' is not a key of {where}; it belongs in "
            f"{' or '.join(elsewhere)}"
        )
    return ConfigError(
        f"unknown config key '{full_key}'.{did_you_mean(leaf, choices)} "
        f"Valid keys here: {', '.join(choices) if choices else '(none)'}"
    )


def load_config(
    path: str | os.PathLike[str] | None = None, overrides: list[str] | None = None
) -> PipelineConfig:
    """Load YAML (with ``defaults``) and ``key=value`` overrides into a validated PipelineConfig.

    Args:
        path: A YAML config file; its ``defaults: [name]`` entries are included first. None
            starts from the schema's defaults.
        overrides: ``key=value`` strings (dotted keys, e.g. ``trainer.lr=1e-5``), applied
            after the file.

    Returns:
        The config, with every rule between fields checked.

    Raises:
        ConfigError: An unknown key, a wrong type or choice, or a broken rule; the message
            names the key and the fix.
    """
    schema = OmegaConf.structured(PipelineConfig)
    try:
        cfg = schema
        if path is not None:
            cfg = OmegaConf.merge(
                cfg, _checked(_replay_from_alias(_load_yaml_with_defaults(Path(path))))
            )
        if overrides:
            bad = [o for o in overrides if "=" not in o]
            if bad:
                raise ConfigError(
                    f"override {bad[0]!r} is not key=value; write it like mode=async"
                )
            cfg = OmegaConf.merge(
                cfg,
                _checked(_replay_from_alias(OmegaConf.from_dotlist(list(overrides)))),
            )
        config: PipelineConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except ConfigKeyError as exc:
        raise _explain_unknown_key(exc) from None
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        msg = str(exc).splitlines()[0]
        raise ConfigError(
            f"config key '{key}': {msg}" if key else f"config error: {msg}"
        ) from None
    validate_config(config)
    return config


def _checked(raw: DictConfig) -> DictConfig:
    """``raw`` after the choices check, so a wrong word fails with the key, the choices and a suggestion."""
    check_fields(PipelineConfig, OmegaConf.to_container(raw, resolve=False))
    return raw


def _replay_from_alias(raw: DictConfig) -> DictConfig:
    """``replay.from`` (what users write) is stored as ``replay.from_dir`` (``from`` is a Python keyword)."""
    replay = raw.get("replay") if isinstance(raw, DictConfig) else None
    if isinstance(replay, DictConfig) and "from" in replay:
        replay["from_dir"] = replay.pop("from")
    return raw


def config_to_yaml(config: PipelineConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))
