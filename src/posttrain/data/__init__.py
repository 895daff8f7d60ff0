"""Datasets on disk (JSON lines of `Example`) and their validation suites."""

from posttrain.data.files import check_examples, read_examples, write_examples

__all__ = ["check_examples", "read_examples", "write_examples"]
