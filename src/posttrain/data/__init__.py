"""Datasets on disk (JSON lines of `Example`) and their validation suites."""

from posttrain.data.files import read_examples, write_examples

__all__ = ["read_examples", "write_examples"]
