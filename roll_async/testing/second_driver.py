"""A second Ray driver for tests: join a running test session's Ray, borrow its engine actor, train one config.

``python -m roll_async.testing.second_driver '<json>'`` with ``address``, ``namespace`` (the session's, so the
engine's name resolves), ``engine`` (the actor's name), ``pythonpath`` (this driver's workers get it, so they
import what this process imports: e.g. another release of an optional library), ``config``, ``overrides`` and
``env_configs`` (tag -> an env_config that replaces the config's).
It prints the run directory as its last line. Used where one process cannot hold both releases of a library
(tests/integration/test_verifiers_train.py) while the suite keeps one engine.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import ray

from roll_async.config.schema import load_config, validate_config
from roll_async.pipelines.agentic_pipeline import AgenticPipeline


async def train(args: dict[str, Any]) -> str:
    engine = ray.get_actor(args["engine"])
    config = load_config(args["config"], list(args["overrides"]))
    for tag, env_config in args.get("env_configs", {}).items():
        config.custom_envs[
            tag
        ].env_config = env_config  # replaced, not merged as an override is
    validate_config(config)
    run = await AgenticPipeline(config, engines=[engine]).run()
    return str(run)


def main(argv: list[str]) -> int:
    args = json.loads(argv[0])
    ray.init(
        address=args["address"],
        namespace=args["namespace"],
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": args["pythonpath"]}},
        log_to_driver=False,
    )
    try:
        print(asyncio.run(train(args)))
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
