"""Named method presets: a preset is a set of `rl` keys, applied on top of params.yaml and below explicit
`--set` overrides (see `posttrain.resolve.load`). A preset maps the `rl` section read so far to the keys it sets.

dapo:    DAPO (Yu et al. 2025, arXiv 2503.14476): clip-higher (eps_high 0.28, eq. 10), token-mean loss
         (eq. 12), dynamic sampling (eq. 11: drop groups whose rewards are all equal, sample more), and the soft
         overlong punishment reward `overlong` (eq. 13) added to the reward list.
dr_grpo: Dr. GRPO (arXiv 2503.20783): no std division + loss normalised by G * L_max.
gspo:    GSPO (arXiv 2507.18071): sequence-level ratio, its clip range 3e-4 / 4e-4 (§5.1), sequence-mean loss.
grpo:    plain GRPO: group-normalised advantage with the PPO clipped surrogate.
ppo:     PPO with a learned critic (Schulman et al. 2017, arXiv 1707.06347; the RLHF recipe of Ouyang et al. 2022,
         arXiv 2203.02155): per-token GAE advantages (eq. 11-12, objectives/gae.py) from a value head on a copy of
         the policy (rl.critic), the clipped surrogate (eq. 7), the clipped value loss `value` (eq. 9) as an
         auxiliary term, token-mean aggregation.

A recipe registers the presets of its own method here on import (`rfpo`: src/posttrain/recipes/rfpo/preset.py).
"""

from __future__ import annotations

from typing import Any

from posttrain.errors import UserError
from posttrain.registry import Registry

presets: Registry = Registry("preset")


def _with_reward(rl: dict[str, Any], name: str) -> list[Any]:
    listed = list(rl.get("rewards") or [])
    names = {r.get("name") if isinstance(r, dict) else r for r in listed}
    return listed if name in names else [*listed, {"name": name, "weight": 1.0}]


def expand(name: str, rl: dict[str, Any]) -> dict[str, Any]:
    """The rl keys preset `name` sets, given the rl section read so far (a UserError for an unknown name)."""
    if name not in presets:
        raise UserError(f"rl.preset: {presets.unknown_message(name)}")
    return presets.get(name)(rl)


@presets.register("dapo")
def dapo(rl: dict[str, Any]) -> dict[str, Any]:
    return {
        "advantage": "grpo", "loss": "clip", "clip_eps_low": 0.2, "clip_eps_high": 0.28, "loss_agg": "token_mean",
        "dynamic_sampling": True, "rewards": _with_reward(rl, "overlong"),
    }


@presets.register("dr_grpo")
def dr_grpo(rl: dict[str, Any]) -> dict[str, Any]:
    return {"advantage": "dr_grpo", "loss": "clip", "loss_agg": "token_sum_norm"}


@presets.register("gspo")
def gspo(rl: dict[str, Any]) -> dict[str, Any]:
    return {"loss": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4, "loss_agg": "seq_mean"}


@presets.register("grpo")
def grpo(rl: dict[str, Any]) -> dict[str, Any]:
    return {"advantage": "grpo", "loss": "clip"}


@presets.register("ppo")
def ppo(rl: dict[str, Any]) -> dict[str, Any]:
    listed = list(rl.get("aux") or [])
    return {"advantage": "gae", "loss": "clip", "loss_agg": "token_mean", "aux": listed if "value" in listed else [*listed, "value"]}


# --- the 2026 catalogue (docs/objectives.md): presets where the anchors ship one -----------------------------

@presets.register("bnpo")
def bnpo(rl: dict[str, Any]) -> dict[str, Any]:
    """TRL loss_type="bnpo": the clipped surrogate, token mean over the (local) batch."""
    return {"loss": "clip", "loss_agg": "token_mean"}


@presets.register("sapo")
def sapo(rl: dict[str, Any]) -> dict[str, Any]:
    """SAPO (arXiv 2511.20347): the soft gate, sequence-mean aggregation (TRL, verl, AReaL)."""
    return {"loss": "sapo", "loss_agg": "seq_mean"}


@presets.register("gmpo")
def gmpo(rl: dict[str, Any]) -> dict[str, Any]:
    """GMPO (arXiv 2507.20673): geometric-mean ratio, log-space clip (e^-0.4, e^0.4), mean over sequences."""
    return {"loss": "geo_mean", "clip_eps_low": 0.4, "clip_eps_high": 0.4, "loss_agg": "seq_mean"}


@presets.register("dppo")
def dppo(rl: dict[str, Any]) -> dict[str, Any]:
    """DPPO binary-TV (arXiv 2602.04879), token mean (verl dppo_tv, SkyRL dppo)."""
    return {"loss": "dppo_tv", "loss_agg": "token_mean"}


@presets.register("clip_cov")
def clip_cov(rl: dict[str, Any]) -> dict[str, Any]:
    """the entropy-mechanism losses (arXiv 2505.22617), token mean (verl)."""
    return {"loss": "clip_cov", "loss_agg": "token_mean"}


@presets.register("kl_cov")
def kl_cov(rl: dict[str, Any]) -> dict[str, Any]:
    """the entropy-mechanism losses (arXiv 2505.22617), token mean (verl)."""
    return {"loss": "kl_cov", "loss_agg": "token_mean"}


@presets.register("pass_at_k")
def pass_at_k(rl: dict[str, Any]) -> dict[str, Any]:
    """verl's grpo_passk estimator with the clipped surrogate."""
    return {"advantage": "grpo_passk", "loss": "clip"}


@presets.register("luspo")
def luspo(rl: dict[str, Any]) -> dict[str, Any]:
    """TRL loss_type="luspo": GSPO's sequence ratio, each sequence's token SUM averaged over sequences."""
    return {"loss": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4, "loss_agg": "seq_mean_token_sum"}


@presets.register("lite_ppo")
def lite_ppo(rl: dict[str, Any]) -> dict[str, Any]:
    """LitePPO (arXiv 2508.08221): group mean / batch std advantage + token-level aggregation (AReaL)."""
    return {"advantage": "lite_ppo", "loss": "clip", "loss_agg": "token_mean"}


@presets.register("vespo")
def vespo(rl: dict[str, Any]) -> dict[str, Any]:
    """TRL loss_type="vespo": the gamma kernel, token mean."""
    return {"loss": "vespo", "loss_agg": "token_mean"}


@presets.register("icepop")
def icepop(rl: dict[str, Any]) -> dict[str, Any]:
    """IcePop token masking of the train-inference mismatch (verl low_high threshold), the clipped surrogate."""
    return {"loss": "clip", "correction": "icepop"}


@presets.register("m2po")
def m2po(rl: dict[str, Any]) -> dict[str, Any]:
    """AReaL's M2PO example: second-moment masking on the decoupled loss."""
    return {"loss": "clip", "correction": "m2po", "loss_agg": "token_mean"}
