"""Evaluation harness: greedy and sampled accuracy of a checkpoint on held-out prompts."""
