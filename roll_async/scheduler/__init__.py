"""Rollout scheduling: which env plays which episode, and when a batch of whole groups is ready.

Import from the modules: ``group_queue`` (the rules; its pieces in
``pending_groups``, ``seat_assignment``, ``batch_serving``, ``busy_window`` and
``worker_faults``), ``interface`` (``RolloutScheduling``: what callers use of a
scheduler), ``rollout_scheduler`` (over Ray actors), ``local`` (in one process),
``validation``, ``layout``, ``serve_order``, ``queue_rules``, ``served_batch``
and ``filters``. The package itself imports nothing, so reading a filter name or
a layout never loads Ray.
"""
