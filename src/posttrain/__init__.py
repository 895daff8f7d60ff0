"""posttrain: post-training generative models with reinforcement learning."""

__version__ = "0.1.0"
