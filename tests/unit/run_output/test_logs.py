"""Console routing: roll-async's messages at logging.level, other libraries only at ERROR, everything in RUN_DIR/logs."""

from __future__ import annotations

import logging

import pytest

from roll_async.engine.worker_extension import install_reload_warning_filter
from roll_async.errors import ConfigError
from roll_async.run_output.logs import attach_run_logs


@pytest.fixture
def run_logs(tmp_path, capsys):
    root = logging.getLogger()
    before = list(root.handlers), root.level
    log_dir = attach_run_logs(tmp_path, "INFO")
    yield log_dir
    for handler in list(root.handlers):
        if handler not in before[0]:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(before[1])


def test_console_keeps_own_messages_and_library_errors_file_keeps_all(run_logs, capsys):
    logging.getLogger("roll_async.scheduler").info("own info line")
    logging.getLogger("vllm.engine").warning("vllm warning line")
    logging.getLogger("ray._private.worker").info("Started a local Ray instance.")
    logging.getLogger("transformers.modeling_utils").error("transformers error line")
    console = capsys.readouterr().err
    assert "own info line" in console and "transformers error line" in console
    assert (
        "vllm warning line" not in console
        and "Started a local Ray instance" not in console
    )
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.flush()
    saved = (run_logs / "driver.log").read_text()
    assert all(
        text in saved
        for text in (
            "own info line",
            "vllm warning line",
            "Started a local Ray",
            "transformers error line",
        )
    )


def test_a_bad_level_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="logging.level='LOUD'"):
        attach_run_logs(tmp_path, "LOUD")


def _reload_warning(layer: str) -> logging.LogRecord:
    return logging.LogRecord(
        "vllm.model_executor.model_loader.reload.layerwise",
        logging.WARNING,
        __file__,
        266,
        "%s: Failed to load weights",
        (layer,),
        None,
    )


def test_only_expected_reload_warnings_are_demoted():
    tied = install_reload_warning_filter(tied_lm_head=True)
    assert not tied.filter(_reload_warning("RotaryEmbedding"))
    assert not tied.filter(_reload_warning("Llama3RotaryEmbedding"))
    assert not tied.filter(_reload_warning("ParallelLMHead"))
    # a weight we failed to send: stays a warning
    assert tied.filter(_reload_warning("QKVParallelLinear"))
    untied = install_reload_warning_filter(tied_lm_head=False)
    assert untied is tied  # installed once
    # an untied head must receive its weight
    assert untied.filter(_reload_warning("ParallelLMHead"))
