"""GLIME's editing step on a micro model and hand-made records, the naive baseline it reduces to, the naive
baseline on GLIME's paraphrase prompts, the fact set's disjoint splits, the edit-file checks and the `edit` options validation."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import REPO
from posttrain import resolve
from posttrain.config import LoraConfig, ModelConfig
from posttrain.recipes.editing.settings import FactsConfig
from posttrain.recipes.editing.facts import ROLES, Edit, build_fact_set, edit_stream, read_edits, split_facts
from posttrain.errors import UserError
from posttrain.models import build_tiny, train_char_tokenizer
from posttrain.recipes.editing.objective import EditStep, edit_methods
from posttrain.recipes.editing.glime import GlimeOptions, preference_loss, project_gradient
from posttrain.recipes.editing.trainer import apply_edits, edited_parameters, make_record, pair_scorer

FACTS = FactsConfig(n_subjects=6, relations=2, objects_per_relation=4, seed=0)


@pytest.fixture(scope="module")
def micro():
    facts = build_fact_set(FACTS)
    tokenizer = train_char_tokenizer([facts.alphabet()])
    torch.manual_seed(0)
    cfg = ModelConfig(path=None, arch="qwen2", hidden_size=16, layers=1, heads=2, kv_heads=1, intermediate_size=32, max_positions=64,
                      dtype="float32", lora=LoraConfig(r=0, alpha=1, dropout=0.0, target_modules=()))
    return facts, build_tiny(cfg, tokenizer), tokenizer


def records(micro, n):
    facts, model, tokenizer = micro
    return [make_record(model, tokenizer, facts, e, 8) for e in edit_stream(facts, n, seed=1)]


def grads_after(method, micro, current, memory, opts, seed=0):
    facts, model, tokenizer = micro
    params = edited_parameters(model, ["mlp"])
    edit_methods.get(method)(EditStep(pair_scorer(model, tokenizer), params, current, memory, torch.Generator().manual_seed(seed)), opts)
    grads = torch.cat([p.grad.flatten() for p in params])
    for p in params:
        p.grad = None
    return grads


def opts(**kw):
    return GlimeOptions(**{"beta": 0.1, "lambda_p": 1.0, "replay_size": 1, "project": True, **kw})


def test_dpo_term_is_log2_per_pair_before_the_edit_moves_the_model(micro):
    facts, model, tokenizer = micro
    recs = records(micro, 3)
    step = EditStep(pair_scorer(model, tokenizer), [], recs, [], torch.Generator())
    assert sum(len(r.pref_pairs) for r in recs) == 3 * len(ROLES["paraphrase"])
    assert float(preference_loss(step, recs, beta=0.1).detach()) == pytest.approx(math.log(2), abs=1e-5)
    assert not any(r.ref_chosen.requires_grad or r.ref_rejected.requires_grad for r in recs)


def test_glime_without_replay_and_preference_is_the_naive_step(micro):
    current, memory = records(micro, 3)[:1], records(micro, 3)[1:]
    naive = grads_after("naive", micro, current, memory, None)
    assert torch.equal(grads_after("glime", micro, current, memory, opts(lambda_p=0.0, replay_size=0)), naive)
    assert torch.equal(grads_after("glime", micro, current, [], opts(lambda_p=0.0)), naive)  # empty buffer: g unchanged
    assert not torch.equal(grads_after("glime", micro, current, [], opts()), naive)  # the preference term moves it


def test_naive_paraphrase_is_naive_plus_the_new_object_on_glimes_paraphrase_prompts(micro):
    """The same-exposure control: its gradient is naive's plus that of -mean log pi(o_new | p') over exactly the
    paraphrase prompts GLIME's preference term reads; without paraphrase pairs it is the naive step."""
    from dataclasses import replace

    from posttrain.recipes.editing.objective import grads_of, paraphrase_loss

    facts, model, tokenizer = micro
    current, memory = records(micro, 3)[:1], records(micro, 3)[1:]
    params = edited_parameters(model, ["mlp"])
    expected = torch.cat([g.flatten() for g in grads_of(paraphrase_loss(pair_scorer(model, tokenizer), current), params)])
    naive = grads_after("naive", micro, current, memory, None)
    assert torch.allclose(grads_after("naive_paraphrase", micro, current, memory, None), naive + expected, atol=1e-6)
    assert {p.prompt for p in current[0].pref_pairs} == set(facts.prompts(current[0].edit.subject, current[0].edit.relation, "paraphrase"))
    assert all(p.chosen == current[0].edit.new for p in current[0].pref_pairs)
    bare = [replace(current[0], pref_pairs=())]
    assert torch.equal(grads_after("naive_paraphrase", micro, bare, memory, None), grads_after("naive", micro, bare, memory, None))


def test_glime_step_is_projected_g_plus_replay_gradient(micro):
    current, memory = records(micro, 2)[:1], records(micro, 2)[1:]
    g = grads_after("glime", micro, current, [], opts(replay_size=0))
    g_ref = grads_after("glime", micro, memory, [], opts(replay_size=0))
    total = grads_after("glime", micro, current, memory, opts())
    assert torch.allclose(total, project_gradient(g, g_ref) + g_ref, atol=1e-6)
    assert float(torch.dot(total - g_ref, g_ref)) >= -1e-6  # invariant 1: the current part never fights the replay
    unprojected = grads_after("glime", micro, current, memory, opts(project=False))
    assert torch.allclose(unprojected, g + g_ref, atol=1e-6)


def test_projection_removes_exactly_the_conflicting_component():
    g, g_ref = torch.tensor([3.0, -4.0]), torch.tensor([0.0, 2.0])
    assert torch.allclose(project_gradient(g, g_ref), torch.tensor([3.0, 0.0]))
    assert project_gradient(torch.tensor([3.0, 4.0]), g_ref).tolist() == [3.0, 4.0]  # no conflict: unchanged


def test_editing_loop_metrics_are_rates(micro):
    facts, model, tokenizer = micro
    edits = edit_stream(facts, 2, seed=0)
    cfg = resolve.load(REPO / "params.yaml", ["edit.method=glime", "edit.steps_per_edit=2", "edit.log_every=1"]).edit
    state = {k: v.clone() for k, v in model.state_dict().items()}
    history, metrics = apply_edits(model, tokenizer, facts, edits, cfg, 0, on_log=lambda i, m: None)
    model.load_state_dict(state)
    model.requires_grad_(True)
    assert len(history) == 2 and metrics["n_edits"] == 2.0
    for key in ("edit_success", "retention", "generalization", "paraphrase_accuracy", "locality", "unedited_accuracy", "base_locality"):
        assert 0.0 <= metrics[key] <= 1.0, key
    assert metrics["base_locality"] == 1.0


def test_fact_set_splits_are_disjoint():
    facts = build_fact_set(FactsConfig(n_subjects=30, relations=5, objects_per_relation=8, seed=3))
    assert build_fact_set(FactsConfig(n_subjects=30, relations=5, objects_per_relation=8, seed=3)) == facts
    edits = edit_stream(facts, 20, seed=0)
    split = split_facts(facts, edits)
    assert not set(split["edited"]) & set(split["unedited"]) and len(split["edited"]) + len(split["unedited"]) == len(facts.facts)
    assert all(e.new != e.old and e.new in facts.objects[e.relation] and facts.facts[e.subject, e.relation] == e.old for e in edits)
    roles = [set(t) for t in ROLES.values()]
    assert all(not a & b for i, a in enumerate(roles) for b in roles[i + 1:])
    by_role = {role: {p for s, r in facts.facts for p in facts.prompts(s, r, role)} for role in ROLES}
    assert all(not by_role[a] & by_role[b] for a in ROLES for b in ROLES if a < b)
    every = [p for s, r in facts.facts for p in facts.all_prompts(s, r)]
    assert len(every) == len(set(every)) == 5 * len(facts.facts)  # no prompt asks two facts
    edited_prompts = {p for s, r in split["edited"] for p in facts.all_prompts(s, r)}
    assert not edited_prompts & {p for s, r in split["unedited"] for p in facts.all_prompts(s, r)}


def write(tmp_path, *records):
    path = tmp_path / "edits.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_edit_file_round_trip_and_errors(tmp_path):
    facts = build_fact_set(FACTS)
    (s, r), old = next(iter(facts.facts.items()))
    new = next(o for o in facts.objects[r] if o != old)
    assert read_edits(write(tmp_path, {"subject": s, "relation": r, "new": new}), facts) == [Edit(s, r, old, new)]
    bad = {
        "not valid JSON": "{oops",
        "string fields": {"subject": s, "relation": r},
        "unknown relation": {"subject": s, "relation": "planet", "new": new},
        "no fact": {"subject": "zzzzz", "relation": r, "new": new},
        "already says": {"subject": s, "relation": r, "new": old},
        "alphabet": {"subject": s, "relation": r, "new": "Q!"},
        "disagrees": {"subject": s, "relation": r, "new": new, "old": new},
    }
    for needle, record in bad.items():
        with pytest.raises(UserError, match=needle) as err:
            read_edits(write(tmp_path, record), facts)
        assert str(tmp_path / "edits.jsonl") + ":1" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError, match="edited twice"):
        read_edits(write(tmp_path, *[{"subject": s, "relation": r, "new": new}] * 2), facts)


@pytest.mark.parametrize("override,needle", [
    ("edit.options.naive={}", "edit.options.naive: no registered edit method named 'naive' takes options"),
    ("edit.options.glime.replay=2", "edit.options.glime.replay"),
    ("edit.method=glyme", "did you mean 'glime'"),
    ("edit.options.glime.replay=-1", "edit.options.glime.replay"),
])
def test_edit_options_are_validated(override, needle):
    with pytest.raises(UserError) as err:
        resolve.load(REPO / "params.yaml", [override])
    assert needle in str(err.value)
