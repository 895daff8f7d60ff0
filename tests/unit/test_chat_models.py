"""Real-shaped checkpoints (BPE tokenizer + chat template, tiny Qwen2 / Llama saved to disk): prompts rendered by
the chat template, assistant-only SFT labels, stop strings, activation checkpointing and autocast."""

from __future__ import annotations

import copy

import pytest
import torch

from posttrain.errors import UserError
from posttrain.models import load_pretrained, prepare_model
from posttrain.models.chat import PromptFormat, configure_prompts, encode_prompts, encode_supervised, supervised_row
from posttrain.models.logprobs import completion_forward
from posttrain.models.precision import apply_precision
from posttrain.rollout.sampling import StopStrings, generate
from posttrain.tasks import Example

CPU = torch.device("cpu")
CONVERSATION = (
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "12+34="},
    {"role": "assistant", "content": "46"},
    {"role": "user", "content": "01+02="},
    {"role": "assistant", "content": "3"},
)


@pytest.fixture(params=["qwen2", "llama"])
def loaded(request, chat_checkpoints):
    model, tokenizer = load_pretrained(chat_checkpoints[request.param])
    return model, tokenizer


def model_cfg(cfg, **update):
    return cfg.model.model_copy(update=update)


def test_checkpoint_loads_by_path_with_its_template(chat_checkpoints):
    for arch, path in chat_checkpoints.items():
        model, tokenizer = load_pretrained(path)
        assert model.config.model_type == arch and model.config.num_hidden_layers == 2 and model.config.hidden_size == 32
        assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
        assert tokenizer.decode(tokenizer.encode("12+34=46 <answer>")) == "12+34=46 <answer>"


def test_prompts_are_rendered_by_the_chat_template(loaded, cfg):
    model, tokenizer = loaded
    prepare_model(model, tokenizer, model_cfg(cfg, system_prompt="Be brief."), CPU, train=False)
    examples = [Example("12+34=", "46", "46"), Example("7+8=", "15", "15", system="You add numbers.")]
    ids, mask = encode_prompts(tokenizer, examples, CPU)
    expected = [
        tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "12+34="}],
                                      add_generation_prompt=True, tokenize=True)["input_ids"],
        tokenizer.apply_chat_template([{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "7+8="}],
                                      add_generation_prompt=True, tokenize=True)["input_ids"],
    ]
    for row, row_mask, want in zip(ids, mask, expected):
        assert row[row_mask.bool()].tolist() == want and bool(row_mask[-1])  # left-padded
    assert tokenizer.decode(ids[0][mask[0].bool()]).endswith("<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n")


def test_raw_prompts_without_a_template_or_when_off(loaded, cfg, char_tokenizer):
    model, tokenizer = loaded
    configure_prompts(tokenizer, PromptFormat("off"))
    ids, _ = encode_prompts(tokenizer, ["12+34="], CPU)
    assert ids[0].tolist() == tokenizer.encode("12+34=", add_special_tokens=False)
    configure_prompts(char_tokenizer, PromptFormat())  # auto, but the character tokenizer has no template
    ids, mask = encode_prompts(char_tokenizer, ["12+34=", "1+2="], CPU)
    old = char_tokenizer(["12+34=", "1+2="], return_tensors="pt", padding=True, add_special_tokens=False)
    assert torch.equal(ids, old.input_ids) and torch.equal(mask, old.attention_mask)


def test_long_prompts_are_left_truncated(loaded):
    _, tokenizer = loaded
    configure_prompts(tokenizer, PromptFormat(max_prompt_tokens=5))
    ids, _ = encode_prompts(tokenizer, ["12+34+56+78+90="], CPU)
    full = tokenizer.apply_chat_template([{"role": "user", "content": "12+34+56+78+90="}], add_generation_prompt=True, tokenize=True)["input_ids"]
    assert ids[0].tolist() == full[-5:]
    row, labels = supervised_row(tokenizer, Example("12+34+56+78+90=", "270", "270"))
    assert labels[:5] == [-100] * 5 and tokenizer.decode(labels[5:9]) == "270<|im_end|>" and len(row) == 10  # one token per digit; and the template's "\n"


def test_sft_loss_falls_on_assistant_turns_only(loaded):
    _, tokenizer = loaded
    configure_prompts(tokenizer, PromptFormat())
    ids, labels = supervised_row(tokenizer, Example("", "", "", messages=CONVERSATION))
    assert ids == tokenizer.apply_chat_template(list(CONVERSATION), tokenize=True)["input_ids"]
    learnt = tokenizer.decode([t for t in labels if t != -100])
    assert learnt == "46<|im_end|>3<|im_end|>"
    prompt_part = [t for t, label in zip(ids, labels) if label == -100]  # system and user turns, assistant headers
    assert "You add numbers." in tokenizer.decode(prompt_part) and "12+34=" in tokenizer.decode(prompt_part)
    # a prompt/completion example is the same conversation with one assistant turn: completion + end of turn
    ids, mask, labels = encode_supervised(tokenizer, [Example("12+34=", "46", "46", system="You add numbers.")])
    assert tokenizer.decode(labels[labels != -100]) == "46<|im_end|>"
    assert tokenizer.decode(ids[0][mask[0].bool()]) == tokenizer.apply_chat_template(list(CONVERSATION[:3]), tokenize=False)


def test_templates_without_generation_blocks_find_assistant_turns_by_prefix(loaded):
    _, marked = loaded
    plain = copy.deepcopy(marked)
    plain.chat_template = marked.chat_template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    for tokenizer in (marked, plain):
        configure_prompts(tokenizer, PromptFormat())
    assert supervised_row(plain, Example("", "", "", messages=CONVERSATION)) == supervised_row(marked, Example("", "", "", messages=CONVERSATION))


def test_messages_need_a_template(char_tokenizer):
    configure_prompts(char_tokenizer, PromptFormat())
    with pytest.raises(UserError, match="chat template"):
        supervised_row(char_tokenizer, Example("1+2=", "3", "3", messages=CONVERSATION))


def test_eos_becomes_the_templates_end_of_turn(loaded):
    _, tokenizer = loaded
    base = copy.deepcopy(tokenizer)
    base.eos_token = "<|endoftext|>"  # a base checkpoint: EOS is not the end of an assistant turn
    configure_prompts(base, PromptFormat())
    assert base.eos_token == "<|im_end|>"


def test_stop_strings_end_and_cut_completions(loaded):
    model, tokenizer = loaded
    configure_prompts(tokenizer, PromptFormat())
    torch.manual_seed(0)
    _, free = generate(model, tokenizer, ["12+34="], 24, greedy=True)
    stop = free[0][3:5]  # a piece the free run writes
    samples, texts = generate(model, tokenizer, ["12+34="], 24, greedy=True, stop=[stop, "never written"])
    assert texts[0] == free[0][: free[0].find(stop)] and bool(samples.finished[0])
    produced = samples.completion_ids[0][samples.completion_mask[0].bool()]
    assert stop in tokenizer.decode(produced) and stop not in tokenizer.decode(produced[:-1])  # stopped on the token that wrote it
    assert StopStrings(tokenizer, ["</answer>"]).cut("<answer>7</answer> more") == "<answer>7"


def _loss_and_grads(model, tokenizer):
    examples = [Example("12+34=", "46", "46"), Example("1+2=", "3", "3", system="You add numbers.")]
    ids, mask, labels = encode_supervised(tokenizer, examples)
    model.zero_grad(set_to_none=True)
    sft = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    prompt_ids, prompt_mask = encode_prompts(tokenizer, [e for e in examples for _ in range(2)], CPU)
    completion = torch.randint(3, len(tokenizer), (4, 3), generator=torch.Generator().manual_seed(0))
    logp = completion_forward(model, prompt_ids, prompt_mask, completion, torch.ones_like(completion)).logp
    (sft - logp.mean()).backward()
    return sft.detach(), logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_gradient_checkpointing_gives_the_same_loss_and_gradients(loaded, cfg):
    model, tokenizer = loaded
    plain = prepare_model(copy.deepcopy(model), tokenizer, model_cfg(cfg), CPU).train()
    checkpointed = prepare_model(copy.deepcopy(model), tokenizer, model_cfg(cfg, gradient_checkpointing=True), CPU).train()
    assert checkpointed.is_activation_checkpointing and not plain.is_activation_checkpointing
    loss, logp, grads = _loss_and_grads(plain, tokenizer)
    loss_c, logp_c, grads_c = _loss_and_grads(checkpointed, tokenizer)
    torch.testing.assert_close(loss_c, loss)
    torch.testing.assert_close(logp_c, logp)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_c[name], grad, rtol=1e-4, atol=1e-6)


def test_bf16_autocast_runs_every_forward(loaded, cfg):
    model, tokenizer = loaded
    fast = prepare_model(copy.deepcopy(model), tokenizer, model_cfg(cfg, autocast="bf16", lora=cfg.model.lora.model_copy(update={"r": 4})), CPU)
    out = fast(input_ids=torch.tensor([[3, 4, 5]]))
    assert out.logits.dtype == torch.bfloat16 and not torch.is_autocast_enabled("cpu")  # the context ends with the forward
    loss, logp, grads = _loss_and_grads(fast.train(), tokenizer)
    assert torch.isfinite(loss) and torch.isfinite(logp).all() and grads and all(torch.isfinite(g).all() for g in grads.values())
    samples, texts = generate(fast, tokenizer, ["12+34="], 6, group_size=2)
    assert samples.completion_ids.shape[0] == 2 and len(texts) == 2
    reference = copy.deepcopy(fast)  # the RL reference copy keeps its own autocast
    assert reference(input_ids=torch.tensor([[3, 4]])).logits.dtype == torch.bfloat16


def test_fp16_autocast_needs_cuda(loaded):
    model, _ = loaded
    with pytest.raises(UserError, match="fp16 needs a CUDA device"):
        apply_precision(model, "fp16", False, CPU)


def test_sampler_dtype_is_set_by_prepare_model_and_fp16_needs_cuda(loaded, cfg):
    from posttrain.models.decoders import SAMPLER_DTYPE, unwrap

    model, tokenizer = loaded
    prepared = prepare_model(copy.deepcopy(model), tokenizer, model_cfg(cfg, sampler_dtype="bfloat16"), CPU)
    assert getattr(unwrap(prepared), SAMPLER_DTYPE) == torch.bfloat16 and next(prepared.parameters()).dtype == torch.float32
    samples, _ = generate(prepared, tokenizer, ["12+34="], 6, group_size=2)
    assert samples.logp.dtype == torch.float32 and torch.isfinite(samples.logp).all()
    with pytest.raises(UserError, match="sampler_dtype float16 needs a CUDA device"):
        prepare_model(copy.deepcopy(model), tokenizer, model_cfg(cfg, sampler_dtype="float16"), CPU)


def test_the_length_check_counts_the_rendered_prompt_not_its_text(loaded, cfg, tmp_path):
    """A prompt whose text fits but whose chat rendering (system turn, headers) does not is refused by the token
    count the model reads, for sampling stages and SFT rows alike."""
    from posttrain.data import check_examples

    model, tokenizer = loaded
    prepare_model(model, tokenizer, model_cfg(cfg, system_prompt="You add numbers."), CPU, train=False)
    example = Example("12+34=", "46", "46")
    rendered = len(encode_prompts(tokenizer, [example], CPU)[0][0])
    text = len(tokenizer.encode(example.prompt, add_special_tokens=False))
    assert rendered > text + 5  # the system turn and the headers
    model = copy.deepcopy(model)
    model.config.max_position_embeddings = text + 6  # the raw text and 6 new tokens would fit
    with pytest.raises(UserError, match=rf"row 1: the prompt is {rendered} tokens as the model reads it; with 6 for rl.max_new_tokens"):
        check_examples(tmp_path / "train.jsonl", [example], model, tokenizer, 6, "rl.max_new_tokens")
    with pytest.raises(UserError, match=rf"row 1: the SFT row is {len(supervised_row(tokenizer, example)[0])} tokens"):
        check_examples(tmp_path / "train.jsonl", [example], model, tokenizer, 0, "", supervised=True)


def test_the_reward_model_reads_prompts_as_the_policy_does(loaded, cfg, chat_checkpoints, tmp_path):
    """The BT reward model encodes `prompt + response + EOS` with the prompt through the chat template (system turn
    included) and the response as the assistant turn; the format it was trained with is saved next to its weights
    and attached again when RL loads it."""
    import json
    import shutil

    from posttrain.models.chat import prompt_format
    from posttrain.rewards.bradley_terry import POOLING_FILE, encode_texts, load_bt

    model, tokenizer = loaded
    prepare_model(model, tokenizer, model_cfg(cfg, system_prompt="Be brief."), CPU, train=False)
    ids, mask, response = encode_texts(tokenizer, [Example("12+34=", "46", "46")], ["46"], CPU)
    prompt = encode_prompts(tokenizer, ["12+34="], CPU)[0][0].tolist()
    assert ids[0][mask[0].bool()].tolist()[: len(prompt)] == prompt and "Be brief." in tokenizer.decode(prompt)
    assert tokenizer.decode(ids[0][response[0].bool()]) == "46<|im_end|>"

    shutil.copytree(chat_checkpoints["qwen2"], tmp_path / "model")
    saved = {"chat_template": "auto", "system_prompt": "Be brief.", "max_prompt_tokens": 0}
    (tmp_path / "model" / POOLING_FILE).write_text(json.dumps({"pooling": "last", "range": [0, 1], "prompt_format": saved}))
    _, reward_tokenizer, _ = load_bt(str(tmp_path))
    assert prompt_format(reward_tokenizer).system_prompt == "Be brief."
