"""Test aids, not used by the production path: a fake engine for scheduling tests, scripted envs and a tiny tokenizer.

They live in the package (not under tests/) so Ray workers can import them by module path, as
``numpy.testing`` and ``torch.testing`` do for their test aids.
"""
