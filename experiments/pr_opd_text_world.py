"""Claim (d), PR-OPD (privileged representation OPD) and UniOPSD (peer-hindsight step credit at anchors) vs GRPO on
the key-room text world (envs/text_world.py): after a GRPO warm start, aligning the skill-free hidden states to the
policy's own skill-reading pass helps it learn the rooms; fusing the environment's step credit at shared states with a
successful peer's hindsight does too.

The start model is SFT'd on (i) reference transcripts for the start states of rooms a-d only, (ii) every
training start state behind a hint naming a random cell (`g<cell>=<prompt>` -> the walk there), (iii)
reflections on successful walks (`<prompt><walk with observations>==` -> `g<cell where it stopped>`,
trainers/contexts.reflection_prompt), and (iv) every training start state behind another start's walk to a
random cell (`<peer walk>=<prompt>` -> the walk to the same cell, trainers/contexts.peer_context), so that
the policy can use a hint or a peer's transcript and, after reading an episode and its outcome, pick a skill
from the task's vocabulary (`g0`..`g4`), but knows the goals of rooms e-p only through reward. Arms from that
start, same seed and budget: `grpo`, `pr_opd` (GRPO + lambda_rep * L_rep after `--warm-start` updates) and
`uniopsd` (its fused advantage, with the clipped surrogate). Success is the episode reward (stop on the goal);
held-out success is measured by sampling `--eval-samples` episodes per held-out start state.

    .venv/bin/python experiments/pr_opd_text_world.py [--steps N] [--json FILE] [--micro]
"""

from __future__ import annotations

import random
import time

import torch

import _common as C
from posttrain import resolve
import _distill as D
from posttrain.envs.text_world import CELLS, ROOMS, shortest_actions, transcript
from posttrain.objectives.distill.uniopsd import arbitration
from posttrain.rollout.sampling import generate
from posttrain.trainers import contexts
from posttrain.tasks import Example

ARMS = ("grpo", "pr_opd", "uniopsd")


def sft_mix(train: list[Example], seed: int) -> list[Example]:
    """Reference transcripts for the rooms `a`-`d` only, plus three skills taught on random goals (so they reveal
    no room's goal): following a written hint, writing one (`g<cell where it stopped>`) after reflecting on a
    successful walk, and following a peer's walk to the cell it stopped on (from another start)."""
    rng = random.Random(seed)
    plain = [e for e in train if e.prompt[0] in ROOMS[:4]]
    hinted, hindsight, peered = [], [], []
    for e in train:
        start = int(e.prompt[1])
        goal = rng.randrange(CELLS)
        walk = transcript(start, shortest_actions(start, goal))
        hinted.append(Example(contexts.skill_context(e, f"g{goal}"), walk, str(goal)))
        hindsight.append(Example(contexts.reflection_prompt(e, walk, True), f"g{goal}", str(goal)))  # the walk as lived: observations in
        other = rng.choice([c for c in range(CELLS) if c != goal])  # a peer that moved, so its transcript names the cell
        peered.append(Example(contexts.peer_context(e, transcript(other, shortest_actions(other, goal))), walk, str(goal)))
    return plain + hinted + hindsight + peered


def start_signals(cfg, task, train, path, seed: int) -> dict[str, float]:
    """What each method is fed on the SFT start, from one UniOPSD update's episodes (16 prompts x G): the success
    rate; UniOPSD's share of taught steps, of steps with step evidence (an anchor with >= 2 steps and differing
    returns), of later steps that share their anchor, the mean |A^E| and |A^S - omega A^E| per step and the share
    of steps where the two tiers differ;
    PR-OPD's share of admissible skills and of skills naming the room's goal after a success / a failure."""
    from posttrain.envs.text_world import goal_of
    from posttrain.objectives.distill.uniopsd import tiers
    from posttrain.trainers.extras import ExtraContext, decode_transcripts, row_examples, success, write_skills
    from posttrain.trainers.online_rl import OnlineRL, PromptStream, RLRun

    model, tok = C.load_pretrained(path)
    rl_cfg = resolve.updated(cfg.rl, "rl", advantage="uniopsd", aux=(), checkpoint_every=0)
    run = RLRun(model, tok, task, train, rl_cfg, seed, C.CACHE / "unused_ckpt", "signals")
    prompts = PromptStream(train, seed).take(rl_cfg.prompts_per_step)
    batch = OnlineRL(run, total_steps=1).step(prompts).batch
    opts = rl_cfg.options_for("uniopsd")
    steps, tier = tiers(batch, batch.extras["peer_logp_gap"], rl_cfg, opts)
    later = torch.ones_like(steps.row, dtype=torch.bool)
    later[torch.cat([torch.zeros(1, dtype=torch.long), (steps.row[1:] != steps.row[:-1]).nonzero().squeeze(-1) + 1])] = False
    _, inverse, counts = steps.anchor.unique(return_inverse=True, return_counts=True)
    gap = tier.a_step - opts.step_advantage_w * tier.a_episode
    ok = success(batch)
    rows = row_examples(prompts, batch)
    ctx = ExtraContext(model, tok, task, rl_cfg, {}, rl_cfg.options_for("pr_opd").warm_start + 1, torch.Generator().manual_seed(seed))
    reflections = [contexts.reflection_prompt(e, t, bool(s)) for e, t, s in zip(rows, decode_transcripts(tok, batch), ok.tolist())]
    skills = write_skills(ctx, rows, reflections)
    named = torch.tensor([k == f"g{goal_of(e.prompt[0])}" for k, e in zip(skills, rows)])
    return {"success": float(ok.float().mean()), "uniopsd_taught_steps": float(tier.has_teacher.float().mean()),
            "uniopsd_step_evidence": float(tier.has_step.float().mean()), "uniopsd_later_steps_shared": float((counts[inverse][later] >= 2).float().mean()),
            "uniopsd_episode_abs": float(tier.a_episode.abs().mean()), "uniopsd_step_minus_episode": float(gap.abs().mean()),
            "uniopsd_tiers_differ": float((gap.abs() > 1e-6).float().mean()),
            "pr_opd_admissible": sum(bool(k) for k in skills) / len(skills),
            "pr_opd_goal_named_after_success": float(named[ok].float().mean()) if ok.any() else float("nan"),
            "pr_opd_goal_named_after_failure": float(named[~ok].float().mean()) if (~ok).any() else float("nan")}


@torch.no_grad()
def env_success(model, tok, task, examples, samples: int, max_tokens: int, seed: int) -> dict[str, float]:
    _, texts = generate(model, tok, [e.prompt for e in examples], max_tokens, group_size=samples,
                        generator=torch.Generator().manual_seed(seed), sampler=task.sampler(tok))
    rows = [e for e in examples for _ in range(samples)]
    rate = sum(task.correctness_reward(t, True, e) for t, e in zip(texts, rows)) / len(rows)
    return {"greedy_accuracy": float("nan"), "sampled_accuracy": rate}


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 150, [("--warm-start", int, 30, "GRPO-only updates before L_rep"),
                                                      ("--eval-samples", int, 8, "episodes per held-out start state")])
    t0 = time.time()
    world = ["task.name=text_world", "task.n_train=60", "task.n_heldout=20", "rl.max_new_tokens=12", "rl.prompts_per_step=16",
             "rl.rewards=[{name: correctness}]", f"rl.options.pr_opd.warm_start={args.warm_start}", "rl.options.pr_opd.skill_tokens=3"]
    cfg = C.load_config(args, world)
    task = C.build_task(cfg.task)
    splits = task.splits(args.seed)
    train, held = splits["train"], splits["heldout"]
    path = D.sft_on(cfg, task, sft_mix(train, args.seed), args.seed, "text_world_sft")
    model, tok = C.load_pretrained(path)
    evaluate = lambda m, t: env_success(m, t, task, held, args.eval_samples, cfg.rl.max_new_tokens, args.seed)  # noqa: E731
    start = evaluate(model, tok)
    print(f"SFT held-out success {start['sampled_accuracy']:.4f}", flush=True)
    signals = start_signals(cfg, task, train, path, args.seed)
    print("signals on the start: " + ", ".join(f"{k} {v:.3f}" for k, v in signals.items()), flush=True)
    k = max(1, args.steps // 5)
    arms = {}
    for arm in ARMS:
        rl_cfg = resolve.updated(cfg.rl, "rl", **{"aux": ("pr_opd",) if arm == "pr_opd" else (), "advantage": "uniopsd" if arm == "uniopsd" else "grpo"})
        read = []  # UniOPSD's arbitration on each of its own updates
        on_step = (lambda s, r, c=rl_cfg, out=read: out.append(arbitration(r.batch, c))) if arm == "uniopsd" else None
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed, on_step=on_step, evaluate_fn=evaluate)
        arms[arm] = {"heldout_after": after, "rl_seconds": round(seconds, 1), "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg})}
        if read:
            arms[arm]["arbitration"] = {key: sum(x[key] for x in read) / len(read) for key in read[0]}
            arms[arm]["arbitration_curve"] = {key: [round(x[key], 4) for x in read] for key in ("rho_used", "c_star", "arbitrated_share")}
            print("uniopsd arbitration, mean over the run: " + ", ".join(f"{key} {v:.3f}" for key, v in arms[arm]["arbitration"].items()), flush=True)
        print(f"{arm}: {seconds:.0f}s, held-out success {after['sampled_accuracy']:.4f}", flush=True)
    rows = [{**D.summary_row(a, arms[a], k), "rep_loss_last": C.window_mean(arms[a]["_history"], "pr_opd/rep_loss", False, k)} for a in ARMS]
    text = C.print_table(f"\nPR-OPD and UniOPSD vs GRPO on the key-room text world, {args.steps} steps, warm start {args.warm_start} (first/last {k} steps)", rows)
    D.finish(args, cfg, "pr_opd_text_world", arms, rows, text, {"sft_heldout": start, "signals": signals, "k": k, "warm_start": args.warm_start}, t0)


if __name__ == "__main__":
    C.run_seeds(main, "pr_opd_text_world")
