"""Media files the stages write and log as artifacts: animated GIFs of uint8 RGB frames (an episode, a clip, a plan)."""

from __future__ import annotations

from pathlib import Path


def write_gif(frames, path: Path, scale: int = 4, ms_per_frame: int = 120) -> None:
    """An animated GIF of uint8 frames [T, S, S, 3], each pixel `scale` x `scale`."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(f).resize((f.shape[1] * scale, f.shape[0] * scale), Image.NEAREST) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=ms_per_frame, loop=0)
