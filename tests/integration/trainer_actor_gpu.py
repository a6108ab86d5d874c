"""The trainer actor on a Ray instance that offers one logical GPU; run by test_trainer_actor.py.

Ray is started with ``num_gpus=1`` (a logical GPU: Ray schedules and assigns it, no
hardware needed). Prints one JSON line: the actor's placement (assigned resources,
GPU ids, device), the tensor names in the weight buckets it put in the object
store, and the error for asking more GPUs than the cluster has.
"""

from __future__ import annotations

import json
import sys


def main(model_path: str) -> None:
    import ray
    from safetensors.torch import load

    from roll_async.config.schema import TrainerConfig
    from roll_async.errors import ConfigError
    from roll_async.trainer.trainer_actor import TrainerActorClient

    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False)
    try:
        try:
            TrainerActorClient.start(
                TrainerConfig(placement="ray_actor", num_gpus=2), model_path
            )
            too_many = ""
        except ConfigError as exc:
            too_many = str(exc)
        client = TrainerActorClient.start(
            TrainerConfig(placement="ray_actor", num_gpus=1), model_path
        )
        names: list[str] = []
        for ref in client.engine_weight_refs():
            names.extend(load(ray.get(ref)).keys())
        client.shutdown()
        print(
            json.dumps(
                {
                    "placement": client.placement,
                    "bucket_tensors": sorted(names),
                    "too_many_gpus": too_many,
                }
            )
        )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
