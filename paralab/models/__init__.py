"""Models that paralab trains: a small GPT-style decoder built as a list of parts."""

from paralab.models.gpt import GPT, Block, Embedding, Head, build_part, part_names

__all__ = ["GPT", "Block", "Embedding", "Head", "build_part", "part_names"]
