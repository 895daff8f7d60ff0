"""Teacher contexts: the text a (self-)teacher reads in front of the student's own response.

Every context is `<privileged text><SEP><prompt>`, so the teacher scores exactly the student's tokens
after a prompt that differs only by what it was told. Built from `=` and `-` (and SIPO's `+` label), characters
of the arithmetic and text-world alphabets, so a character tokenizer trained on the task can encode them.
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


def answer_context(example: Example) -> str:
    """OPSD's privileged context: the reference solution, then the prompt."""
    return f"{example.completion}{SEP}{example.prompt}"


def peer_context(example: Example, peer_completion: str) -> str:
    """UniOPSD's hindsight context: a successful peer's response, then the prompt."""
    return f"{peer_completion}{SEP}{example.prompt}"


def trace_context(example: Example, trace: str) -> str:
    """ThinkOPD's context: the teacher's think trace z, then the prompt."""
    return f"{trace}{SEP}{example.prompt}"


def skill_context(example: Example, skill: str) -> str:
    """PR-OPD's context: the policy's hindsight skill, then the prompt (an empty skill adds nothing, so the
    teacher pass then equals the student pass)."""
    return f"{skill}{SEP}{example.prompt}" if skill else example.prompt


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


def contrastive_contexts(example: Example, mistakes: list[str]) -> tuple[str, str]:
    """SIPO's (C+, C-): the reference and the group's mistakes, framed with the reference as correct and the
    mistakes as incorrect (C+) or the other way round (C-). The two strings have the same characters
    except the labels, so biases common to both (length, style, having a hint at all) cancel in the gap."""
    def framed(ref_label: str, mistake_label: str) -> str:
        return example.completion + ref_label + "".join(m + mistake_label for m in mistakes) + SEP + example.prompt

    return framed(CORRECT, INCORRECT), framed(INCORRECT, CORRECT)


def group_mistakes(texts: list[str], success: list[bool], own: int, limit: int) -> list[str]:
    """Distinct wrong responses of the other rollouts of a group (at most `limit`), for SIPO's mistake set."""
    out: list[str] = []
    for j, (text, ok) in enumerate(zip(texts, success)):
        if j != own and not ok and text and text not in out:
            out.append(text)
    return out[:limit]
