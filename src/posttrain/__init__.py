"""posttrain: post-training generative models with reinforcement learning.

`posttrain.run_stage(...)` and `posttrain.load_settings(...)` are the CLI's entry points as Python (posttrain/api.py);
they load on first use, so `import posttrain` stays cheap.
"""

__version__ = "0.1.0"
__all__ = ["load_settings", "run_stage", "__version__"]


def __getattr__(name: str):
    if name in ("run_stage", "load_settings"):
        from posttrain import api  # lazily: the front door re-exports the launcher layer's API

        return getattr(api, name)
    raise AttributeError(f"module 'posttrain' has no attribute {name!r}")
