"""The search recipe's settings sections: `bridge` (stage bridge) and `asct` (stage asct); recipes/search/params.yaml
and recipes/search/bridge.yaml set what a run changes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from posttrain.config import Registered, Section
from posttrain.stages import sections


@sections.register("bridge", help="stage bridge (recipes/search/bridge_trainer.py, recipes/search/bridge_objective.py) on task.name: search")
class BridgeConfig(Section):
    """BRIDGE and its comparison arms on the search task (recipes/search/bridge_trainer.py; stage `bridge`, recipes/search/dvc.yaml; docs/search.md)."""

    arm: Literal["frozen", "naive", "policy_first", "bridge"] = "bridge"  # frozen: policy-only GRPO; naive: joint; policy_first; bridge
    retriever: Annotated[str, Registered("retrievers")] = "dual_encoder"  # stage bridge: the learned retriever (upper level); the task's writes the SFT references
    iterations: int = Field(10, gt=0)  # rollout + update rounds
    prompts_per_step: int = Field(4, gt=0)
    group_size: int = Field(4, ge=2)  # G episodes per question (GRPO's group)
    max_new_tokens: int = Field(140, gt=0)  # per episode: actions and observations
    policy_lr: float = Field(0.001, gt=0)  # Adam
    retriever_lr: float = Field(0.01, ge=0)  # eta_phi (Adam); 0 freezes the retriever
    inner_lr: float = Field(0.01, gt=0)  # theta_hat: one SGD step of this size on the lower-level (GRPO) loss
    gamma0: float = Field(1.0, ge=0)  # gamma_k = gamma0 (1 + k)^gamma_power
    gamma_power: float = Field(0.5, ge=0)
    mu: float = Field(0.0, ge=0)  # weight of the contrastive retrieval loss L_ret (positives: passages of successful episodes)
    is_clip: float = Field(5.0, gt=1)  # importance ratios clipped to [1/is_clip, is_clip], then self-normalised
    memory_efficient: bool = True  # theta_hat in place through the gradient buffers (no second policy copy); false: on a copy
    max_grad_norm: float = Field(1.0, gt=0)
    clip_eps: float = Field(0.2, gt=0)  # GRPO's ratio clip
    tau: float = Field(0.5, gt=0)  # the retrieval policy's softmax(score / tau) over the top-N candidates
    sft_steps: int = Field(200, ge=0)  # warm start on the reference transcripts (loss on the policy's own tokens)
    sft_lr: float = Field(0.003, gt=0)
    sft_batch_size: int = Field(8, gt=0)
    retriever_warmup_steps: int = Field(30, ge=0)  # weak contrastive pre-training of the dual encoder (entity-only queries)
    example_episodes: int = Field(8, ge=0)  # stage bridge: held-out greedy episodes logged as an MLflow table
    log_every: int = Field(5, gt=0)  # stage bridge: iterations between MLflow metric points
    checkpoint_every: int = Field(5, ge=0)  # stage bridge: iterations between checkpoints (`posttrain bridge --resume`); 0: none


class AsctLMConfig(Section):  # asct.lm: the language-model actor (asct.actor lm; recipes/search/asct_actors.py)
    lr: float = Field(0.001, gt=0)  # Adam on the LM in the PPO updates
    sft_steps: int = Field(100, ge=0)  # warm start on the environment's reference transcripts (loss on the LM's own tokens); 0: none
    sft_lr: float = Field(0.003, gt=0)
    sft_batch_size: int = Field(16, gt=0)
    score_batch: int = Field(256, gt=0)  # (state, action) rows per LM forward when scoring legal actions


@sections.register("asct", help="stage asct (recipes/search/asct_trainer.py); the environment: task search (task.options.search; its cost_per_call is the utility's)")
class AsctConfig(Section):
    """Stage `asct`: ASCT (specs §24) in the search environment (task `search`); recipes/search/asct_trainer.py."""

    actor: Annotated[str, Registered("asct_actors")] = "lm"  # lm: the language model (the `model` section) | mlp: features -> score
    lm: AsctLMConfig = AsctLMConfig()  # the lm actor (recipes/search/asct_actors.py)
    credit: Annotated[str, Registered("asct_credits")] = "asct"  # asct (the tree's centred Q) | trajectory (U - mean U) | mc_value (VinePPO)
    tree_policy: Annotated[str, Registered("tree_policies")] = "uniform"  # uniform | uct | agent_uct (rollout/tree.py)
    n_sim: int = Field(8, gt=0)  # simulations per actor-visited state (credit asct)
    uct_c: float = Field(1.0, ge=0)  # the UCT exploration constant c
    cost_weight: float = Field(0.1, ge=0)  # AgentUCT's kappa per tool call (the utility's cost per call)
    lambda_mix: float = Field(1.0, ge=0, le=1)  # credit = lambda_mix A_local + (1 - lambda_mix) (U - mean U)
    mc_rollouts: int = Field(8, gt=0)  # rollouts per visited state of the Monte-Carlo value baseline (credit mc_value)
    mc_token_budget: int = Field(0, ge=0)  # > 0: mc_value's rollouts per visited state run until their tokens reach it (matched spend)
    iterations: int = Field(60, gt=0)  # rollout + credit + PPO rounds
    episodes: int = Field(16, gt=0)  # actor episodes per round (training questions drawn with replacement)
    epochs: int = Field(4, gt=0)  # PPO passes over a round's visited states
    lr: float = Field(0.01, gt=0)  # Adam on the mlp actor (the lm actor's: lm.lr)
    clip_eps: float = Field(0.2, gt=0)  # PPO ratio clip
    entropy_coef: float = Field(0.01, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    hidden_size: int = Field(32, gt=0)  # the mlp actor: an MLP scoring each legal action from its features
    max_steps: int = Field(6, gt=0)  # actions per episode (an episode cut off scores as unanswered)
    n_heldout: int = Field(200, gt=0)  # held-out questions for the greedy actor's figures (at most task.n_heldout)
    eval_samples: int = Field(0, ge=0)  # > 0: also this many sampled actor episodes per held-out question (heldout_sampled_*)
    example_episodes: int = Field(8, ge=0)  # held-out episodes logged as a table (queries, passages, answers)
    log_every: int = Field(5, gt=0)
    checkpoint_every: int = Field(10, ge=0)  # rounds between checkpoints: `posttrain asct --resume`; 0: none
