"""What one SPMD trainer rank needs, torch alone: its process group, FSDP2 sharding, its share of a batch, sharded checkpoints and gathered weights.

Ray is not imported here: the rank actors (roll_async.trainer.ranks) host these
pieces, and tests drive them in plain processes too.
"""
