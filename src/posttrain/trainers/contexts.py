"""Teacher contexts: the text a (self-)teacher reads in front of the student's own response.

Two framings of the same information, so the teacher scores exactly the student's tokens after a prompt that
differs only by what it was told:

- character (default): `<privileged text><SEP><prompt>`, built from `=` and `-` (and SIPO's `+` label), characters
  of the arithmetic and text-world alphabets, so a character tokenizer trained on the task can encode them (a
  from-scratch model must be taught the format; the experiments SFT it on contexts like these);
- natural (`natural=True`, what a chat model gets: trainers/extras.py passes `uses_chat(tokenizer)`): the prompt,
  then the privileged text introduced in words ("A reference solution: ..."), then a line asking for the model's
  own answer (OPSD's pi_theta(. | x, y*): the problem and the reference solution), which an instruct model reads
  without training. The chat template then renders it as the user turn, with the example's system prompt.
"""

from __future__ import annotations

from posttrain.tasks import Example

SEP = "="  # between the privileged text and the prompt
# SIPO's labels: the two contexts differ in these characters only. Neither is SEP, so a label is never read as the
# end of the privileged text (`=` as CORRECT made "<ref>==<prompt>" look like an unlabelled reference). `+` is in the
# default arithmetic alphabet; a task without it should add LABEL_CHARS to its tokenizer's corpus.
CORRECT, INCORRECT = "+", "-"
LABEL_CHARS = CORRECT + INCORRECT
OUTCOME_OK, OUTCOME_FAILED = "=", "-"  # PR-OPD's hindsight outcome label (its SFT format; not SIPO's labels)


# the natural framing's closing line: what the teacher is asked to do after reading the privileged text
OWN_ANSWER = "Now answer the problem yourself."
# SIPO's labels in the natural framing: equally long, so C+ and C- differ in the label words only
RIGHT, WRONG = "Right", "Wrong"


def told(example: Example, lead: str, text: str, natural: bool = False) -> str:
    """`example`'s prompt with the privileged `text`: `<text><SEP><prompt>`, or (natural) the prompt, then
    `<lead>: <text>` and OWN_ANSWER."""
    return f"{example.prompt}\n\n{lead}: {text}\n{OWN_ANSWER}" if natural else f"{text}{SEP}{example.prompt}"


def answer_context(example: Example, natural: bool = False) -> str:
    """OPSD's privileged context: the reference solution and the prompt."""
    return told(example, "A reference solution", example.completion, natural)


def peer_context(example: Example, peer_completion: str, natural: bool = False) -> str:
    """UniOPSD's hindsight context: a successful peer's response and the prompt."""
    return told(example, "A correct solution from another attempt", peer_completion, natural)


def trace_context(example: Example, trace: str, natural: bool = False) -> str:
    """ThinkOPD's context: the teacher's think trace z and the prompt."""
    return told(example, "Worked reasoning", trace, natural)


def skill_context(example: Example, skill: str, natural: bool = False) -> str:
    """PR-OPD's context: the policy's hindsight skill and the prompt (an empty skill adds nothing, so the
    teacher pass then equals the student pass)."""
    return told(example, "A lesson from an earlier attempt", skill, natural) if skill else example.prompt


def reflection_prompt(example: Example, trajectory: str, success: bool) -> str:
    """What the policy reads before it writes a hindsight skill for its own episode: the task, the whole
    trajectory as it lived it (actions and observations), its outcome (a label character) and SEP. It ends
    with the outcome, not with the task prompt, so what follows is read as a lesson about the episode rather
    than as another answer to the task."""
    return f"{example.prompt}{trajectory}{OUTCOME_OK if success else OUTCOME_FAILED}{SEP}"


def retrospection_prompt(example: Example, attempt: str, feedback: str) -> str:
    """ROFT's retrospection prompt: the attempt, the environment's feedback, then the task again; the model
    continues with its explanation / the more direct solution."""
    return f"{attempt}{INCORRECT}{feedback}{SEP}{example.prompt}"


def contrastive_contexts(example: Example, mistakes: list[str], natural: bool = False) -> tuple[str, str]:
    """SIPO's (C+, C-): the reference and the group's mistakes, framed with the reference as correct and the
    mistakes as incorrect (C+) or the other way round (C-). The two strings have the same characters
    except the labels, so biases common to both (length, style, having a hint at all) cancel in the gap.
    Natural: one line per answer, `Right: <answer>` / `Wrong: <answer>`, after the prompt."""
    def framed(ref_ok: bool) -> str:
        if natural:
            lines = [f"{RIGHT if ref_ok else WRONG}: {example.completion}", *(f"{WRONG if ref_ok else RIGHT}: {m}" for m in mistakes)]
            return f"{example.prompt}\n\nAnswers to this problem, each marked right or wrong:\n" + "\n".join(lines) + f"\n{OWN_ANSWER}"
        ref_label, mistake_label = (CORRECT, INCORRECT) if ref_ok else (INCORRECT, CORRECT)
        return example.completion + ref_label + "".join(m + mistake_label for m in mistakes) + SEP + example.prompt

    return framed(True), framed(False)


def group_mistakes(texts: list[str], success: list[bool], own: int, limit: int) -> list[str]:
    """Distinct wrong responses of the other rollouts of a group (at most `limit`), for SIPO's mistake set."""
    out: list[str] = []
    for j, (text, ok) in enumerate(zip(texts, success)):
        if j != own and not ok and text and text not in out:
            out.append(text)
    return out[:limit]
