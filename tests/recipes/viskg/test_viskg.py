"""VisKG's invariants (specs §29): the graph parser's triples have three non-empty fields and an unparseable graph
earns no format reward; negative-rationale samples always end with the correct answer; the GDPO invariants hold on
VisKG's reward matrix through the estimator the trainer calls; the question graph is shorter than the caption of the
same image; and the vision-language model loads by path (tiny, saved to disk) with the same outputs."""

from __future__ import annotations

import pytest
import torch

from posttrain.recipes.viskg import data as D
from posttrain.objectives import advantages
from posttrain.objectives.gdpo import per_reward_normalized
from posttrain.recipes.viskg.rewards import compactness_reward, format_reward, parse_graph, parse_output, reward_row

QS = D.questions(0, 300, grid=3, n_objects=4, max_hops=3)
COUNT = lambda text: len(text.split())  # noqa: E731  (word-level: one token a word)


class Eps:
    std_eps, std_scaling = 1e-4, "group"


def test_every_parsed_triple_has_three_non_empty_fields():
    for q in QS[:100]:
        for kind in ("kg", "caption"):
            parsed = parse_output(D.target(q, kind))
            assert parsed.tag == kind and parsed.graph and all(len(t) == 3 and all(f.strip() for f in t) for t in parsed.graph)
    assert parse_graph(" ( red square , left_of , blue circle ) ; ( a , b , c ) ") == (("red square", "left_of", "blue circle"), ("a", "b", "c"))


@pytest.mark.parametrize("graph", ["", " ", "( a , b )", "( a , b , c , d )", "( a , , c )", "( , b , c )", "( a , b , c ) ; ",
                                   "( a , b , c ) junk", "a , b , c", "( a , b , c ) ( d , e , f )", "( a , ( b ) , c )"])
def test_an_unparseable_graph_earns_no_format_reward(graph):
    text = f"<kg> {graph} </kg> <think> x </think> <answer> red </answer>"
    parsed = parse_output(text)
    assert parsed.graph is None and format_reward(parsed, "kg") == 0.0 and compactness_reward(parsed, 3, 128) == 0.0
    assert reward_row(text, "red", "kg", 128, COUNT) == (1.0, 0.0, 0.0)  # the answer still counts: rewards are separate columns


def test_layout_and_tag_are_checked():
    good = D.target(QS[0], "kg")
    assert reward_row(good, QS[0].answer, "kg", 128, COUNT)[:2] == (1.0, 1.0)
    assert format_reward(parse_output(good), "caption") == 0.0  # the caption arm must write a caption
    swapped = good.replace("<think>", "<tmp>").replace("<answer>", "<think>").replace("<tmp>", "<answer>")
    assert parse_output(swapped).tag is None and reward_row(swapped, QS[0].answer, "kg", 128, COUNT) == (0.0, 0.0, 0.0)
    assert reward_row(good.replace(f"<answer> {QS[0].answer}", "<answer> purple"), QS[0].answer, "kg", 128, COUNT)[0] == 0.0


def test_compactness_is_one_minus_the_budget_share():
    parsed = parse_output(D.target(QS[0], "kg"))
    assert compactness_reward(parsed, 32, 128) == pytest.approx(0.75) and compactness_reward(parsed, 500, 128) == 0.0


def test_negative_rationales_always_end_with_the_correct_answer():
    examples = D.sft_examples(QS, "kg", 1.0, seed=3)
    negatives = [(i, t) for i, t in examples if "incorrect reasoning" in t]
    assert len(negatives) == len(QS)
    for i, text in negatives:
        q = QS[i]
        assert text.endswith(f"<answer> {q.answer} </answer>") and parse_output(text).answer == q.answer
        think = parse_output(text).think
        wrong, right = think.split("this is wrong because")
        assert wrong.startswith("incorrect reasoning :") and right.rstrip().endswith(f"its {q.attribute} is {q.answer} .")
        assert D.target(q, "kg").split("<think>")[0] == text.split("<think>")[0]  # the same graph, a wrong then a right chain


def test_the_negative_share_follows_the_ratio():
    examples = D.sft_examples(QS, "kg", 1 / 3, seed=0)
    assert sum("incorrect reasoning" in t for _, t in examples) == round(len(QS) / 3)
    assert len(examples) == len(QS) + round(len(QS) / 3)


def test_questions_are_answerable_from_the_scene_and_need_their_hops():
    hops = [q.hops for q in QS]
    assert set(hops) == {1, 2, 3}
    for q in QS:
        current = q.path[0]
        for r, nxt in zip(q.relations, q.path[1:]):
            assert D.neighbour(q.objects, current, r) == nxt
            current = nxt
        assert len({(o.color, o.shape) for o in q.objects}) == len(q.objects)  # every object is named uniquely
    image = D.render(QS[0], 8)
    o = QS[0].objects[0]
    assert image.shape == (24, 24, 3) and tuple(image[o.row * 8 + 4, o.col * 8 + 4]) == D.COLORS[o.color]


def test_the_question_graph_is_shorter_than_the_caption_of_the_same_image():
    for q in QS:
        assert COUNT(D.knowledge_graph(q)) < COUNT(D.caption(q))


def _vis_kg_rewards(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    acc = (torch.rand(16, generator=g) < 0.5).float()
    fmt = (torch.rand(16, generator=g) < 0.7).float()
    kg = torch.rand(16, generator=g) * fmt
    return torch.stack([acc, fmt, kg], 1), torch.arange(4).repeat_interleave(4)


def test_gdpo_invariants_on_the_vis_kg_reward_matrix():
    gdpo = advantages.entry("gdpo").meta["on_rewards"]
    grpo = advantages.entry("grpo").meta["on_rewards"]
    rewards, group = _vis_kg_rewards(0)
    w = torch.tensor([1.0, 1.0, 0.5])
    a = gdpo(rewards, group, w, Eps)
    assert abs(float(a.mean())) < 1e-5 and float(a.std()) == pytest.approx(1.0, abs=1e-3)  # 3. batch whitening
    scaled = rewards.clone()
    scaled[:, 2] *= 7.0
    assert torch.allclose(gdpo(scaled, group, w, Eps), a, atol=1e-3)  # 2. one reward scaled by c > 0
    constant = rewards.clone()
    constant[group == 1, 1] = 1.0  # 1. format constant in group 1: its column adds exactly 0 to that group's sum
    assert torch.all(per_reward_normalized(constant, group, Eps.std_eps)[group == 1, 1] == 0)
    varied = constant.clone()
    varied[group == 1, 1] = 0.0
    shift = gdpo(constant, group, w, Eps) - gdpo(varied, group, w, Eps)  # the constant's value does not matter
    assert torch.allclose(shift, torch.zeros_like(shift), atol=1e-6)
    # 4. two rows with the same weighted total but other components: GDPO tells them apart, GRPO on the sum does not
    toy, toy_group, even = torch.tensor([[1.0, 0.0, 0], [0.0, 1.0, 0], [0.0, 1.0, 0], [0.0, 0.0, 0], [0, 0, 0], [0, 1.0, 0]]), \
        torch.tensor([0, 0, 0, 0, 1, 1]), torch.tensor([1.0, 1.0, 0.0])
    a_gdpo, a_grpo = gdpo(toy, toy_group, even, Eps), grpo(toy, toy_group, even, Eps)
    assert a_grpo[0] == pytest.approx(float(a_grpo[1])) and abs(float(a_gdpo[0] - a_gdpo[1])) > 1e-3


def test_the_tiny_vlm_loads_by_path_with_the_same_outputs(tmp_path):
    from posttrain.recipes.viskg.vlm import VisionLanguageModel
    from posttrain.recipes.viskg.trainer import encode_completions, encode_prompts

    torch.manual_seed(0)
    vlm = VisionLanguageModel.tiny(D.vocabulary(), 24, 8, 16, 1, 2)
    qs = QS[:3]
    images = torch.from_numpy(D.render_all(qs, 8))
    prompt = encode_prompts(vlm, qs, images)
    ids, mask = vlm.generate(images, *prompt, 6, 0.0)
    before = vlm.completion_logp(images, *prompt, ids, mask)
    vlm.save(tmp_path / "vlm")
    loaded = VisionLanguageModel.load(tmp_path / "vlm")
    assert torch.equal(loaded.generate(images, *prompt, 6, 0.0)[0], ids)
    assert torch.allclose(loaded.completion_logp(images, *prompt, ids, mask), before, atol=1e-6)
    # greedy decoding with the KV cache picks the argmax of the full (uncached) forward at every position
    embeds, prefix_mask = vlm.prefix(images, *prompt)
    full = torch.cat([embeds, vlm.language_model.get_input_embeddings()(ids)], 1)
    logits = vlm.run(full, torch.cat([prefix_mask, mask], 1)).logits[:, embeds.shape[1] - 1:-1]
    assert torch.equal(logits.argmax(-1)[mask.bool()], ids[mask.bool()])
    target = encode_completions(vlm.tokenizer, [D.target(q, "kg") for q in qs])
    assert vlm.completion_logp(images, *prompt, *target).shape == target[0].shape
    # a pretrained causal LM (here the tiny one's, saved on its own) takes a fresh patch encoder through `around`
    around = VisionLanguageModel.around(tmp_path / "vlm" / "language_model", 24, 8)
    assert around.encoder.n_tokens == 9 and around.generate(images, *prompt, 3, 0.0)[0].shape[0] == 3
    with pytest.raises(Exception, match="has no vlm.json"):
        VisionLanguageModel.load(tmp_path)


def test_a_missing_or_bad_vlm_setting_is_one_line(tmp_path):
    from posttrain.errors import UserError
    from posttrain.resolve import load

    from helpers import REPO

    with pytest.raises(UserError, match="viskg.rl.advantage"):
        load(REPO / "params.yaml", ["viskg.rl.advantage=gdpoo"])
    with pytest.raises(UserError, match="model path not found"):
        load(REPO / "params.yaml", [f"viskg.model.path={tmp_path / 'nothing'}"])
    with pytest.raises(UserError, match="max_hops < n_objects"):
        load(REPO / "params.yaml", ["viskg.data.n_objects=3", "viskg.data.max_hops=3"])
