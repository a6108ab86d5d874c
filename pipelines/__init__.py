"""Pipelines: the top of the import graph, composing engine, schedulers and env managers."""
