"""MotionInsight (specs §30): the reward's invariants (a perfect prediction earns the maximum, the reward stays in
[0, 1 + w_c + w_f]), the fixed-format parser, the synthetic clips' annotations and the motion representation."""

from __future__ import annotations

import itertools
import re
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from posttrain.recipes.motion.videos import CAUSES, DIMENSIONS, annotate, make_videos, motion_representation, object_tracks, \
    optical_flow, rgb_representation
from posttrain.recipes.motion.reward import WORDS, cause_f1, motion_reward, parse, render

VIDEO = SimpleNamespace(frames=24, size=32, objects=2, gravity=0.25, clean_fraction=0.25)
W_C, W_F = 0.5, 0.1


def test_a_perfect_prediction_earns_the_maximum_reward():
    for v in make_videos(VIDEO, 40, 0):
        r = motion_reward(render(v.scores, v.causes), v.scores, v.causes, W_C, W_F)
        assert r == {"score_accuracy": 1.0, "cause_f1": 1.0, "format": 1.0, "reward": 1.0 + W_C + W_F}


def test_the_reward_stays_in_its_range_and_an_unparseable_line_earns_nothing():
    rng = random.Random(0)
    videos = make_videos(VIDEO, 20, 1)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 12))) for _ in range(300)]
    lines += [render({d: rng.randint(0, 10) / 10 for d in DIMENSIONS}, rng.sample(CAUSES, rng.randint(0, 3))) for _ in range(300)]
    totals = []
    for line, v in zip(lines, itertools.cycle(videos)):
        r = motion_reward(line, v.scores, v.causes, W_C, W_F)
        assert 0.0 <= r["reward"] <= 1.0 + W_C + W_F + 1e-12
        assert parse(line) is not None or r["reward"] == 0.0
        totals.append(r["reward"])
    assert min(totals) == 0.0 and max(totals) > 1.0  # both ends are reached: the check is not vacuous
    worst = {d: 0.0 for d in DIMENSIONS}
    assert motion_reward(render(worst, ["frozen"]), {d: 1.0 for d in DIMENSIONS}, (), W_C, W_F)["reward"] == pytest.approx(W_F)


@pytest.mark.parametrize("line", [
    "", "consistency 7 continuity 3 plausibility 9",  # no causes field
    "continuity 3 consistency 7 plausibility 9 causes none",  # out of order
    "consistency 11 continuity 3 plausibility 9 causes none",  # off the 0-10 scale
    "consistency 7 continuity 3 plausibility 9 causes frozen frozen",  # a cause twice
    "consistency 7 continuity 3 plausibility 9 causes none frozen",
    "consistency 7 continuity 3 plausibility 9 causes",
])
def test_the_parser_refuses_lines_off_the_format(line):
    assert parse(line) is None


def test_the_parser_reads_what_render_writes():
    j = parse("consistency 7 continuity 3 plausibility 10 causes teleport frozen")
    assert j.scores == {"consistency": 0.7, "continuity": 0.3, "plausibility": 1.0} and j.causes == {"teleport", "frozen"}
    assert parse(render(j.scores, j.causes)) == j and parse(render(j.scores, ())).causes == frozenset()


def test_cause_f1_by_hand():
    assert cause_f1((), ()) == 1.0 and cause_f1(("frozen",), ()) == 0.0 and cause_f1((), ("frozen",)) == 0.0
    assert cause_f1(("frozen", "teleport"), ("frozen",)) == pytest.approx(2 / 3)
    assert cause_f1(("frozen", "teleport"), ("deformation", "teleport")) == pytest.approx(0.5)


def test_each_cause_lowers_the_dimensions_it_damages():
    T = 24
    assert annotate({}, T) == {d: 1.0 for d in DIMENSIONS}
    hit = {"teleport": {"continuity", "plausibility"}, "deformation": {"consistency"}, "gravity_violation": {"plausibility"},
           "identity_swap": {"consistency"}, "frozen": {"continuity", "plausibility"}}
    for cause, dims in hit.items():
        scores = annotate({cause: (6, 1.0, 0)}, T)
        assert {d for d in DIMENSIONS if scores[d] < 1.0} == dims, cause
        later = annotate({cause: (18, 1.0, 0)}, T)  # a lasting cause that starts later damages less
        assert all(later[d] >= scores[d] for d in DIMENSIONS)


def test_the_clips_are_seeded_annotated_and_varied():
    a, b = make_videos(VIDEO, 60, 3), make_videos(VIDEO, 60, 3)
    assert all(np.array_equal(x.frames, y.frames) and x.scores == y.scores for x, y in zip(a, b))
    assert a[0].frames.shape == (24, 32, 32, 3) and a[0].frames.dtype == np.uint8
    assert {c for v in a for c in v.causes} == set(CAUSES) and any(not v.causes for v in a)
    for d in DIMENSIONS:  # scores spread over the scale (rank correlation has something to rank)
        assert len({v.scores[d] for v in a}) >= 4
    assert all(v.scores == {d: 1.0 for d in DIMENSIONS} for v in a if not v.causes)


def _square_clip(path):
    """Frames of one white square at the given (x, y) positions on a 32 x 32 canvas."""
    frames = np.zeros((len(path), 32, 32, 3), np.uint8)
    for f, (x, y) in zip(frames, path):
        f[y - 3: y + 3, x - 3: x + 3] = (200, 200, 200)
    return frames


def test_optical_flow_and_tracks_follow_a_moving_square():
    frames = _square_clip([(8 + 2 * t, 16) for t in range(6)])
    flow = optical_flow(frames)
    inside = frames[1:].max(-1) > 0
    assert flow.shape == (5, 32, 32, 2) and flow[..., 0][inside].mean() > 1.0 and abs(flow[..., 1][inside].mean()) < 0.5
    tracks = object_tracks(frames, 2)
    assert np.allclose(tracks[1:, 0, 6] * 32, 2.0) and np.allclose(tracks[1:, 0, 7], 0.0)  # dx = 2 px, dy = 0
    assert (tracks[:, 1, -1] == 1).all()  # the second slot has no object: flagged missing
    jump = object_tracks(_square_clip([(8, 16), (9, 16), (24, 16), (25, 16)]), 1)
    assert jump[2, 0, 6] * 32 == pytest.approx(15.0)  # a teleport is one large displacement on the track


def test_tracks_see_an_identity_swap_and_a_frozen_object():
    frames = np.zeros((6, 32, 32, 3), np.uint8)
    for t, f in enumerate(frames):  # a red square left, a blue one right; they exchange colours at frame 3
        left, right = ((230, 60, 60), (70, 110, 240)) if t < 3 else ((70, 110, 240), (230, 60, 60))
        f[14:20, 4 + t: 10 + t], f[14:20, 22 - t: 28 - t] = left, right
    tracks = object_tracks(frames, 2)
    colour_jumps = np.abs(np.diff(tracks[:, :, 3:6], axis=0)).sum(-1)  # [T-1, slots]
    assert (colour_jumps[2] > 0.5).all() and (np.delete(colour_jumps, 2, 0) == 0).all()  # both tracks change colour at the swap only
    assert np.allclose(np.abs(tracks[1:, :, 6]) * 32, 1.0)  # and keep their positions (the tracker follows position, not colour)
    frozen = object_tracks(_square_clip([(8, 10), (10, 12), (10, 12), (10, 12)]), 1)
    assert np.allclose(frozen[2:, 0, 6:8], 0.0)


def test_the_two_representations_have_the_evaluators_shapes():
    v = make_videos(VIDEO, 1, 0)[0]
    maps, tracks = motion_representation(v.frames, 2)
    assert maps.shape == (23, 3, 32, 32) and tracks.shape == (23, 18) and set(np.unique(maps[:, 2])) <= {0.0, 1.0}
    rgb, none = rgb_representation(v.frames)
    assert rgb.shape == (24, 3, 32, 32) and none.shape == (24, 0) and 0 <= rgb.min() and rgb.max() <= 1


def test_the_evaluator_writes_soft_tokens_before_the_prompt_and_stops_at_the_end_token():
    from posttrain.recipes.motion.trainer import new_evaluator, tokenizer, video_set

    cfg = SimpleNamespace(track_slots=2, model=SimpleNamespace(encoder_width=8, soft_tokens=3, hidden_size=16, layers=1, heads=2))
    data = video_set(make_videos(VIDEO, 3, 0), "motion", 2, tokenizer(), pool=2)
    assert data.maps.shape == (3, 23, 3, 16, 16) and (data.targets[:, :8] != 0).all()
    model = new_evaluator(cfg, "motion", 0)
    assert model.prefix(data.maps, data.tracks).shape == (3, 4, 16)
    ids, mask = model.generate(data.maps, data.tracks, 10, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert ids.shape[0] == 3 and mask.shape == ids.shape
    eos = model.tokenizer.eos_token_id
    for row, keep in zip(ids.tolist(), mask.tolist()):  # the mask covers the tokens up to and including the first end token
        n = row.index(eos) + 1 if eos in row else len(row)
        assert keep == [1] * n + [0] * (len(row) - n)
    logp = model.token_logp(data.maps, data.tracks, data.targets)
    assert logp.shape == data.targets.shape and (logp <= 0).all()


@pytest.mark.parametrize("override, message", [
    ("motion.rl.advantage=gae", "'gae' needs token-level rollouts"),
    ("motion.track_slots=1", "track_slots (1) must be at least video.objects (2)"),
])
def test_bad_motion_settings_are_refused_in_one_line(override, message):
    from helpers import REPO
    from posttrain import resolve
    from posttrain.errors import UserError

    with pytest.raises(UserError, match=re.escape(message)) as info:
        resolve.load(REPO / "params.yaml", [override])
    assert "\n" not in str(info.value)
