"""One readable file per strategy. Each ends with ``STRATEGIES = [Strategy(...)]`` (see registry.py):
the name, the mesh axes it uses and its ``train(ctx) -> dict``, which runs on every rank.
"""
