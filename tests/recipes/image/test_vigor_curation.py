"""VIGOR-his curation against the synthetic city's ground truth (what every emitted quadruplet must satisfy), and each step alone."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from posttrain.recipes.image.vigor.city import CHANGE_CLASSES, past_scene, recent_scene, scene_table, true_pairs
from posttrain.recipes.image.vigor.curate import curate, read_sources, report
from posttrain.recipes.image.vigor.render import satellite_tile, street_view
from posttrain.recipes.image.vigor.steps import geometric_checks, satellite_diff, template_writer, validate_instruction
from posttrain.recipes.image.vigor.synthetic import write_city
from posttrain.errors import UserError

CFG = SimpleNamespace(  # the recipes/image/params.yaml defaults (checked below)
    d_max_m=10.0, min_gap_years=5, tile_radius_m=6.0, embedder="thumbnail", min_similarity=0.92,
    geometric_check="orb_ransac", min_inlier_ratio=0.25, min_brightness=0.3,
    min_sharpness=0.027, classifier="satellite_diff", min_changed=0.02, instruction_writer="template", min_region_share=0.5,
    heldout_fraction=0.2,
)


@pytest.fixture(scope="module")
def city(tmp_path_factory):
    root = tmp_path_factory.mktemp("city")
    write_city(root, n_locations=150, n_cities=2, image_size=32, seed=5)
    return root


@pytest.fixture(scope="module")
def curated(city):
    return curate(read_sources(city), CFG)


def test_cfg_mirrors_params_yaml():
    from helpers import REPO
    from posttrain import resolve

    defaults = resolve.load(REPO / "recipes" / "image" / "params.yaml").curate.model_dump()  # the recipe's params file
    assert defaults == vars(CFG)


def test_pairs_match_the_generator_truth(city, curated):
    truth = pd.read_parquet(city / "truth" / "panoramas.parquet")
    expected = true_pairs(truth, CFG.min_gap_years)
    emitted = set(zip(curated.table["old_id"], curated.table["new_id"]))
    hits = emitted & expected
    # distractors exist (night, blur, other viewpoint, short gap, neighbouring places) and are mostly refused
    assert truth["distractor"].isin(["night", "blur", "other_heading"]).sum() > 10
    assert len(hits) / len(emitted) >= 0.9  # precision
    assert len(hits) / len(expected) >= 0.9  # recall
    unusable = set(truth.loc[truth["distractor"].isin(["night", "blur"]), "id"])
    assert not unusable & (set(curated.table["old_id"]) | set(curated.table["new_id"]))


def test_change_classes_match_the_truth(city, curated):
    truth = pd.read_parquet(city / "truth" / "panoramas.parquet").set_index("id")
    scenes = pd.read_parquet(city / "truth" / "scenes.parquet")
    same_place = [truth.loc[o, "location"] == truth.loc[n, "location"] for o, n in zip(curated.table["old_id"], curated.table["new_id"])]
    rows = curated.table[same_place]
    location = truth.loc[rows["new_id"], "location"].to_numpy()
    accuracy = (scenes["change"].to_numpy()[location] == rows["change"].to_numpy()).mean()
    assert accuracy >= 0.9
    assert set(rows["change"]) == set(CHANGE_CLASSES)  # every class occurs


def test_every_quadruplet_satisfies_the_spec_invariants(curated):
    t = curated.table
    assert (t["distance_m"] <= CFG.d_max_m).all()
    assert (t["gap_years"] >= CFG.min_gap_years).all() and (t["year_new"] - t["year_old"] == t["gap_years"]).all()
    assert (t["similarity"] >= CFG.min_similarity).all()
    assert t["change"].isin(CHANGE_CLASSES).all()
    assert t["instruction"].str.strip().str.len().gt(0).all()
    assert curated.images.shape == (len(t), 4, 32, 32, 3)
    counts = report(t)
    assert counts.loc["total", "total"] == len(t)


def test_classifier_reads_each_change_from_hand_made_tiles():
    scenes = scene_table(400, seed=9)
    rng = np.random.default_rng(0)
    for _, scene in scenes.drop_duplicates(["change", "side"]).iterrows():
        old = satellite_tile(past_scene(scene), 32, rng)
        new = satellite_tile(recent_scene(scene), 32, rng)
        change, region, _ = satellite_diff(old, new, 0.02)
        assert change == scene["change"], scene.to_dict()
        assert region == scene["side"]


def test_instruction_validation_rejects_the_wrong_side():
    scene = scene_table(50, seed=2).query("change == 'construction'").iloc[0]
    rng = np.random.default_rng(0)
    s_old, s_new = street_view(past_scene(scene), 32, rng), street_view(recent_scene(scene), 32, rng)
    side, other = scene["side"], {"left": "right", "right": "left"}[scene["side"]]
    _, right = template_writer("construction", side, "removed", 2010, 2022)
    _, wrong = template_writer("construction", other, "removed", 2010, 2022)
    assert validate_instruction(right, "construction", side, s_old, s_new, 0.5)
    assert not validate_instruction(wrong, "construction", other, s_old, s_new, 0.5)
    assert not validate_instruction("", "construction", side, s_old, s_new, 0.5)
    assert not validate_instruction("keep the scene exactly as it is", "no_change", "none", s_old, s_new, 0.5)


@pytest.mark.parametrize("damage,message", [
    (lambda d: d.drop(columns=["lat"]), "lacks column"),
    (lambda d: d.assign(lat=d["lat"].where(d.index != 3)), "empty value"),
    (lambda d: d.assign(capture_date="yesterday"), "not a YYYY-MM-DD date"),
    (lambda d: d.assign(lat=d["lat"] + 100), "out of range"),
    (lambda d: d.assign(image_path="images/missing.png"), "do not exist"),
    (lambda d: pd.concat([d, d.head(1)]), "duplicate"),
    (lambda d: d.head(0), "no rows"),
])
def test_a_bad_panorama_table_is_a_user_error(city, tmp_path, damage, message):
    import shutil

    copy = tmp_path / "src"
    shutil.copytree(city, copy)
    damage(pd.read_parquet(copy / "panoramas.parquet")).to_parquet(copy / "panoramas.parquet", index=False)
    with pytest.raises(UserError, match=message):
        read_sources(copy)


def test_an_unreadable_table_is_a_user_error(city, tmp_path):
    import shutil

    copy = tmp_path / "src"
    shutil.copytree(city, copy)
    (copy / "tiles.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(UserError, match="cannot read"):
        read_sources(copy)


def test_geometric_check_separates_the_same_place_from_a_look_alike():
    """Same scene captured twice (other sensor noise, one slot changed) keeps its keypoints in place; a scene
    that only looks alike at thumbnail scale (same layout, other heights and widths) does not."""
    rng = np.random.default_rng(0)
    scene = {"left": "building", "right": "tree", "road_width": 0.25, "hue": 0.1, "height": 0.6}
    changed = {**scene, "right": "empty"}
    look_alike = {**scene, "road_width": 0.21, "height": 0.4}
    agree = geometric_checks.get("orb_ransac")
    same = agree(street_view(scene, 32, rng), street_view(changed, 32, rng))
    other = agree(street_view(scene, 32, rng), street_view(look_alike, 32, rng))
    assert same >= CFG.min_inlier_ratio > other
    view = street_view(scene, 32, rng)
    assert agree(view, view) > same  # identical views agree most
    assert geometric_checks.get("none")(np.zeros((4, 4, 3)), np.ones((4, 4, 3))) == 1.0


def test_emitted_quadruplets_passed_the_geometric_check(curated):
    assert (curated.table["inlier_ratio"] >= CFG.min_inlier_ratio).all() and (curated.table["inlier_ratio"] <= 1).all()
