"""A character-level tokenizer trained offline with the `tokenizers` library.

Tiny task models need no subword vocabulary: one token per character keeps the softmax small and makes
every answer digit its own decision. The result is a `PreTrainedTokenizerFast` that round-trips through
`save_pretrained` / `models.load_tokenizer` (see there why not plain `AutoTokenizer` next to a model).

`train_bpe_tokenizer` is the real-shaped alternative: a byte-level BPE vocabulary with Qwen2's special tokens and
a Qwen2-style chat template whose assistant turns are `{% generation %}` blocks (so assistant masks work), for
small checkpoints that go through every path a real instruct model does (models/chat.py).

`check_vocabulary` is the one check that text fits a tokenizer: a character or word outside the vocabulary is
encoded as `<unk>` without complaint, and a model would then train on (and be scored against) a token that
stands for anything.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from posttrain.errors import UserError

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def train_char_tokenizer(corpus: Iterable[str]) -> PreTrainedTokenizerFast:
    """Learn the character vocabulary of `corpus`; special tokens come first (pad=0, eos=1, unk=2)."""
    core = Tokenizer(models.WordLevel(unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    # every character is kept (the trainer's default cap is 30,000 entries)
    trainer = trainers.WordLevelTrainer(vocab_size=2**21, special_tokens=[PAD, EOS, UNK], min_frequency=1, show_progress=False)
    core.train_from_iterator(corpus, trainer=trainer)
    # prompts are left-padded so every completion starts at the same column; passed to the constructor
    # (not set afterwards) so that save_pretrained records it and the reload keeps it
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left")


ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# Qwen2's layout (`<|im_start|>role\n...<|im_end|>\n`), with the assistant's content and end of turn in a
# `{% generation %}` block: the tokens a model produces, and learns, in an assistant turn
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\n' }}{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}{{- '\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


# Qwen2's pre-tokenizer split (its tokenizer.json): words, single digits (`\p{N}` alone, so a number is learnt
# digit by digit, as real math-capable vocabularies do), punctuation runs and whitespace
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_bpe_tokenizer(corpus: Iterable[str], vocab_size: int = 512, chat_template: str | None = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer learnt from `corpus` (any text encodes: every byte is in the vocabulary), with
    Qwen2's pre-tokenizer split (one token per digit), Qwen2's special tokens (`<|endoftext|>` pads, `<|im_end|>` ends a turn and is EOS) and `chat_template`."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[ENDOFTEXT, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=ENDOFTEXT, eos_token=IM_END, extra_special_tokens=[IM_START],
                                   padding_side="left", chat_template=chat_template)


def word_tokenizer(words: Iterable[str]) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over a closed vocabulary (synthetic benchmarks whose texts are words
    from a fixed list); special tokens first (pad=0, eos=1, unk=2), like `train_char_tokenizer`."""
    vocab = {token: i for i, token in enumerate([PAD, EOS, UNK, *dict.fromkeys(words)])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left", clean_up_tokenization_spaces=False
    )


def unknown_pieces(tokenizer: PreTrainedTokenizerBase, text: str) -> list[str]:
    """The distinct pieces of `text` that `tokenizer` encodes as its unknown token, in order of appearance.
    Empty for a tokenizer without one (byte-level vocabularies encode any text); a slow tokenizer has no
    offsets, so there the whole text stands for its unknown pieces."""
    unk = tokenizer.unk_token_id
    if unk is None:
        return []
    if not tokenizer.is_fast:
        return [text] if unk in tokenizer.encode(text, add_special_tokens=False) else []
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(dict.fromkeys(text[start:end] for token, (start, end) in zip(encoded.input_ids, encoded.offset_mapping) if token == unk))


def check_vocabulary(tokenizer: PreTrainedTokenizerBase, texts: Iterable[str], what: str) -> None:
    """A `UserError` naming `what`, the first text with pieces outside the tokenizer's vocabulary, and those
    pieces. Refused rather than trained on: `<unk>` would silently stand for every unknown character."""
    for text in texts:
        pieces = unknown_pieces(tokenizer, text)
        if pieces:
            shown = ", ".join(map(repr, pieces[:8])) + (f" (+{len(pieces) - 8} more)" if len(pieces) > 8 else "")
            raise UserError(f"{what}: {text[:60]!r} holds {shown}, outside the tokenizer's vocabulary (encoded as {tokenizer.unk_token})")
