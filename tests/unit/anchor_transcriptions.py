"""Faithful transcriptions of the anchors' own functions, for the parity tests of the 2026 catalogue
(tests/unit/test_catalogue_parity.py). Each function follows the named source line by line (same operations, same
order, same constants), trimmed of logging, config objects and distributed code; each names the file and the commit
it was read from. They are references, not library code: nothing under src/ imports them.

Read from:
  verl      volcengine/verl 0.9.1 wheel, verl/trainer/ppo/core_algos.py and rollout_corr_helper.py
  prime-rl  PrimeIntellect-ai/prime-rl 559b447, src/prime_rl/trainer/rl/loss.py, orchestrator/algo/max_rl.py
  SkyRL     NovaSky-AI/SkyRL a956457, skyrl/backends/skyrl_train/utils/ppo_utils.py
  AReaL     inclusionAI/AReaL 4aef98d, areal/trainer/ppo/actor.py (M2PO), areal/utils/data.py (Normalization)
  ROLL      alibaba/ROLL 8eb27cc, roll/pipeline/agentic/agentic_actor_pg_worker.py (_compute_topr_loss)
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch


# --- verl: verl/utils/torch_functional.py helpers and core_algos.agg_loss ------------------------------------------

def masked_sum(values, mask, axis=None):
    return (values * mask).sum(axis=axis)


def masked_mean(values, mask, axis=None):
    s = masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def masked_whiten(values, mask, shift_mean=True):
    mean = masked_mean(values, mask)
    centered = values - mean
    variance = masked_mean(centered**2, mask)
    mask_sum = mask.sum()
    variance = variance * (mask_sum / (mask_sum - 1))  # Bessel (verl's masked_var, unbiased)
    whitened = (values - mean) * torch.rsqrt(variance + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode):
    if loss_agg_mode == "token-mean":
        return masked_sum(loss_mat, loss_mask) / loss_mask.sum()
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        return masked_sum(seq_losses, seq_mask) / seq_mask.sum()
    if loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).float()
        return masked_sum(seq_losses, seq_mask) / seq_mask.sum()
    raise ValueError(loss_agg_mode)


# --- verl policy losses (core_algos.py) -------------------------------------------------------------------------

def verl_vanilla(old_log_prob, log_prob, advantages, response_mask, agg, clip_low, clip_high, clip_ratio_c):
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return verl_agg_loss(pg_losses, response_mask, agg)


def verl_dppo(old_log_prob, log_prob, advantages, response_mask, agg, low, high, clip_ratio_c, kind):
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    truncated_ratio = torch.clamp(ratio, max=clip_ratio_c).detach()
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    if kind == "tv":
        valid_positive_mask = (prob - old_prob) <= high
        valid_negative_mask = (prob - old_prob) >= -low
    else:
        binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
        )
        valid_positive_mask = (binary_kl <= high) | (prob <= old_prob)
        valid_negative_mask = (binary_kl <= low) | (prob >= old_prob)
    valid_mask = torch.where(advantages > 0, valid_positive_mask, valid_negative_mask).detach().float()
    pg_losses = -advantages * truncated_ratio * log_prob * valid_mask
    return verl_agg_loss(pg_losses, response_mask, agg)


def verl_sapo(old_log_prob, log_prob, advantages, response_mask, tau_pos, tau_neg):
    tau_pos = torch.as_tensor(tau_pos, dtype=advantages.dtype)
    tau_neg = torch.as_tensor(tau_neg, dtype=advantages.dtype)
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    taus = torch.where(advantages > 0, tau_pos, tau_neg)
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    return verl_agg_loss(-gates * advantages, response_mask, "seq-mean-token-mean")


def verl_gpg(log_prob, advantages, response_mask, agg):
    return verl_agg_loss(-log_prob * advantages, response_mask, agg)


def verl_clip_cov(old_log_prob, log_prob, advantages, response_mask, agg, clip_low, clip_high, clip_cov_ratio, lb, ub):
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses1 = -advantages * ratio
    corr = torch.ones_like(advantages)
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)
    cov_all = (advantages - masked_mean(advantages, response_mask)) * (
        log_prob - masked_mean(log_prob.detach(), response_mask)
    )
    cov_all[response_mask == 0] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf
    clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    top_k_idx = (cov_all < ub) & (cov_all > lb) & (response_mask > 0)
    top_k_idx = torch.nonzero(top_k_idx)
    if len(top_k_idx) > 0:
        perm = torch.randperm(len(top_k_idx))
        top_k_idx = top_k_idx[perm[: min(clip_num, len(top_k_idx))]]
    else:
        top_k_idx = torch.empty((0, 2), dtype=torch.long)
    corr[top_k_idx[:, 0], top_k_idx[:, 1]] = 0
    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    return verl_agg_loss(pg_losses, response_mask, agg)


def verl_kl_cov(old_log_prob, log_prob, advantages, response_mask, agg, kl_cov_ratio, ppo_kl_coef):
    negative_approx_kl = log_prob - old_log_prob
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl
    pg_losses = pg_losses1
    all_valid = response_mask > 0
    all_valid_idx = torch.nonzero(all_valid.reshape(-1), as_tuple=True)[0]
    all_valid_adv = advantages[all_valid].detach().reshape(-1).cpu()
    all_valid_logp = log_prob[all_valid].detach().reshape(-1).cpu()
    k = min(kl_cov_ratio, len(all_valid_adv))
    if k != 0:
        cov_lst_all = (all_valid_adv - all_valid_adv.mean()) * (all_valid_logp - all_valid_logp.mean())
        k_percent_nums = max(1, int(len(cov_lst_all) * kl_cov_ratio))
        large_cov_idxs = torch.topk(cov_lst_all, k_percent_nums, largest=True).indices
        if len(large_cov_idxs) != 0:
            large_cov_idxs = all_valid_idx[large_cov_idxs]
            rows, cols = large_cov_idxs // advantages.shape[1], large_cov_idxs % advantages.shape[1]
            pg_losses[rows, cols] = pg_losses_kl[rows, cols]
    return verl_agg_loss(pg_losses, response_mask, agg)


def verl_geo_mean(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high):
    negative_approx_kl = log_prob - old_log_prob
    sgn_advantage = torch.sign(advantages)
    negative_approx_kl_clamp = torch.clamp(negative_approx_kl, -clip_low, clip_high)
    negative_approx_kl_min = torch.min(sgn_advantage * negative_approx_kl, sgn_advantage * negative_approx_kl_clamp)
    negative_approx_kl_min = sgn_advantage * negative_approx_kl_min
    response_mask_sum = response_mask.sum(dim=-1)
    ratio = torch.exp((negative_approx_kl_min * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8))
    advantage = (advantages * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8)
    return torch.mean(-advantage * ratio)


def verl_dro(old_log_prob, log_prob, advantages, response_mask, agg, beta):
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    return verl_agg_loss(pg_losses, response_mask, agg)


# --- verl advantage estimators (core_algos.py); scores = token_level_rewards.sum(-1) ------------------------------

def verl_grpo_passk(scores, index, epsilon, norm_adv_by_std_in_grpo):
    advantages = torch.zeros_like(scores)
    id2scores, id2indices = defaultdict(list), defaultdict(list)
    for i in range(scores.shape[0]):
        id2scores[index[i]].append(scores[i])
        id2indices[index[i]].append(i)
    for idx in id2scores:
        rewards = torch.stack(id2scores[idx])
        topk, topk_idx = torch.topk(rewards, 2)
        advantage = topk[0] - topk[1]
        if norm_adv_by_std_in_grpo:
            advantage = advantage / (torch.std(rewards) + epsilon)
        advantages[id2indices[idx][topk_idx[0].item()]] = advantage
    return advantages


def verl_reinforce_pp_baseline(scores, response_mask, index):
    scores = scores.clone()
    response_length = response_mask.shape[-1]
    id2score, id2mean = defaultdict(list), {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        id2mean[idx] = torch.tensor(0.0) if len(id2score[idx]) == 1 else torch.mean(torch.stack(id2score[idx]))
    for i in range(scores.shape[0]):
        scores[i] = scores[i] - id2mean[index[i]]
    scores = scores.unsqueeze(-1).tile([1, response_length]) * response_mask
    return masked_whiten(scores, response_mask) * response_mask


def verl_opo(scores, response_mask, index):
    scores = scores.clone()
    response_length = response_mask.sum(dim=-1)
    id2score, id2len, id2bsl = defaultdict(list), defaultdict(list), {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
        id2len[index[i]].append(response_length[i])
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2bsl[idx] = torch.tensor(0.0)
        else:
            score_tensor, len_tensor = torch.stack(id2score[idx]), torch.stack(id2len[idx])
            id2bsl[idx] = (len_tensor * score_tensor).sum() / len_tensor.sum()
    for i in range(scores.shape[0]):
        scores[i] = scores[i] - id2bsl[index[i]]
    return scores


def verl_gpg_advantage(scores, index, f_norm=1.0):
    scores = scores.clone()
    bsz = scores.shape[0]
    m = torch.count_nonzero(scores)
    alpha = bsz / m.clamp(min=1)
    id2score, id2mean = defaultdict(list), {}
    for i in range(bsz):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        id2mean[idx] = torch.tensor(0.0) if len(id2score[idx]) == 1 else torch.mean(torch.stack(id2score[idx]))
    for i in range(bsz):
        scores[i] = alpha * (scores[i] - id2mean[index[i]]) / f_norm
    return scores


# --- verl rollout correction (rollout_corr_helper.py) ----------------------------------------------------------

def verl_rejection_mask(log_ratio, response_mask, option_name, lower, upper):
    """compute_rollout_rejection_mask for one option; k1 thresholds are ratio bounds (logged inside)."""
    log_ratio_safe = torch.clamp(log_ratio, min=-20.0, max=20.0)
    token_k1, token_k2 = -log_ratio_safe, 0.5 * log_ratio_safe**2
    token_k3 = torch.exp(log_ratio_safe) - 1.0 - log_ratio_safe
    stats = {"k1": token_k1, "k2": token_k2, "k3": token_k3}[option_name[-2:]]
    is_k1 = option_name.endswith("k1")
    lower_log, upper_log = (math.log(lower), math.log(upper)) if is_k1 else (None, None)
    if option_name.startswith("token"):
        keep = (stats >= lower_log) & (stats <= upper_log) if is_k1 else stats <= upper
    else:
        if option_name.startswith("seq_sum"):
            seq_stat = masked_sum(stats, response_mask, axis=-1)
        elif option_name.startswith("seq_mean"):
            seq_stat = masked_mean(stats, response_mask, axis=-1)
        else:
            neg_inf = torch.tensor(float("-inf"), dtype=stats.dtype)
            max_values = stats.masked_fill(~response_mask.bool(), neg_inf).max(dim=-1).values
            seq_stat = torch.where(max_values == neg_inf, torch.zeros_like(max_values), max_values)
        keep = ((seq_stat >= lower_log) & (seq_stat <= upper_log)) if is_k1 else seq_stat <= upper
        keep = keep.unsqueeze(-1).expand_as(response_mask)
    return (response_mask * keep.to(log_ratio.dtype)).to(dtype=response_mask.dtype)


def verl_icepop_weights(log_ratio, response_mask, lower, upper):
    """compute_rollout_correction_weights(rollout_is="token", rollout_is_threshold=f"{lower}_{upper}")."""
    raw = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0)) * response_mask
    kept = (raw >= lower) & (raw <= upper)
    return torch.where(kept, raw, torch.zeros_like(raw)).detach()


# --- prime-rl (src/prime_rl/trainer/rl/loss.py; per sample, summed, then / the global token count) ---------------

def prime_default_loss(trainer_logprobs, inference_logprobs, advantages, loss_mask, mask_low, mask_high, adv_tau, kl_tau):
    log_importance_ratio = trainer_logprobs - inference_logprobs
    importance_ratio = torch.exp(log_importance_ratio)
    probs_diff = torch.exp(trainer_logprobs) - torch.exp(inference_logprobs)
    invalid = torch.where(advantages > 0, probs_diff > mask_high, probs_diff < -mask_low)
    keep_mask = loss_mask & ~invalid
    pg_loss = keep_mask * (adv_tau * advantages) * importance_ratio
    kl_loss = loss_mask * log_importance_ratio**2
    return (-pg_loss + kl_tau * kl_loss).sum()


def prime_ipo_loss(trainer_logprobs, inference_logprobs, advantages, loss_mask, threshold, adv_tau, kl_tau):
    log_importance_ratio = trainer_logprobs - inference_logprobs
    importance_ratio = torch.exp(log_importance_ratio)
    is_masked = torch.abs(torch.exp(trainer_logprobs) - torch.exp(inference_logprobs)) > threshold
    keep_mask = loss_mask & ~is_masked
    pg_loss = keep_mask * (adv_tau * advantages) * importance_ratio
    kl_loss = loss_mask * log_importance_ratio**2
    return (-pg_loss + kl_tau * kl_loss).sum()


def prime_max_rl(rewards):
    """MaxRLAlgorithm.score_group for one group."""
    mean = rewards.mean()
    return torch.zeros_like(rewards) if mean <= 0 else (rewards - mean) / mean


# --- SkyRL (ppo_utils.py): reduce_loss sums; token_mean scales the advantages by 1 / n_valid first --------------

def skyrl_dual_clip(log_probs, old_log_probs, advantages, loss_mask, eps_low, eps_high, clip_ratio_c):
    ratio = torch.exp(torch.clamp(log_probs - old_log_probs, max=20.0))  # safe_exp_delta(clip=20)
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
    loss = -torch.min(surr1, surr2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, loss)
    loss = torch.where(advantages < 0, clip_pg_losses2, loss)
    return (loss * loss_mask).sum()


def skyrl_dppo(log_probs, old_log_probs, advantages, loss_mask, delta_low, delta_high, dppo_type):
    ratio = torch.exp(torch.clamp(log_probs - old_log_probs, max=20.0))
    with torch.no_grad():
        current_probs, mu_probs = torch.exp(log_probs), torch.exp(old_log_probs)
        prob_diff = current_probs - mu_probs
        mask = torch.ones_like(advantages)
        if dppo_type == "binary_tv":
            mask[(advantages > 0) & (prob_diff > delta_high)] = 0.0
            mask[(advantages < 0) & (-prob_diff > delta_low)] = 0.0
        else:
            eps = 1e-8
            binary_kl = mu_probs * (old_log_probs - log_probs) + (1 - mu_probs) * torch.log(
                (1 - mu_probs + eps) / (1 - current_probs + eps)
            )
            mask[(advantages > 0) & (prob_diff > 0) & (binary_kl > delta_high)] = 0.0
            mask[(advantages < 0) & (prob_diff < 0) & (binary_kl > delta_low)] = 0.0
    loss = -(ratio * advantages * mask)
    return (loss * loss_mask).sum()


def skyrl_cross_entropy(log_probs, loss_mask):
    return (-log_probs * loss_mask).sum()


def skyrl_importance_sampling(log_probs, old_log_probs, advantages, loss_mask):
    prob_ratio = torch.exp(log_probs - old_log_probs)
    return (-(prob_ratio * advantages) * loss_mask).sum()


def skyrl_maxrl(scores, index, epsilon=1e-6):
    scores = scores.clone()
    id2score, id2mean = defaultdict(list), {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        id2mean[idx] = torch.tensor(0.0) if len(id2score[idx]) == 1 else torch.mean(torch.tensor(id2score[idx]))
    for i in range(scores.shape[0]):
        if len(id2score[index[i]]) > 1:
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2mean[index[i]] + epsilon)
        else:
            scores[i] = scores[i] - id2mean[index[i]]
    return scores


# --- AReaL ---------------------------------------------------------------------------------------------------------

def areal_m2po_mask(old_logp, prox_logp, loss_mask, m2_threshold):
    """_apply_m2po_masking + _get_m2po_loss_mask (actor.py)."""
    delta = old_logp - prox_logp
    m2 = delta * delta
    mask_flat = loss_mask.view(-1)
    m2_selected = m2.view(-1)[mask_flat]
    sorted_m2, indices = torch.sort(m2_selected, descending=True)
    restored_indices = torch.argsort(indices)
    n = sorted_m2.numel()
    suffix_sums = sorted_m2.flip(0).cumsum(0).flip(0)
    counts = torch.arange(n, 0, -1, dtype=sorted_m2.dtype)
    avg_m2_suffix = suffix_sums / counts
    below = torch.where(avg_m2_suffix < m2_threshold)[0]
    num_to_mask = below[0].item() if len(below) > 0 else n - 1
    sorted_mask = torch.ones_like(sorted_m2, dtype=torch.bool)
    if num_to_mask > 0:
        sorted_mask[:num_to_mask] = False
    m2_full_flat = torch.zeros_like(mask_flat, dtype=torch.bool)
    m2_full_flat[mask_flat] = sorted_mask[restored_indices]
    return m2_full_flat.view_as(loss_mask)


def areal_group_mean_batch_std(x, group_size, eps):
    """Normalization(mean_level="group", std_level="batch", std_unbiased=True) on [B] rewards, no loss mask."""
    x = x.to(torch.float64)
    mean = torch.zeros_like(x)
    for i in range(0, x.shape[0] // group_size):
        s = slice(i * group_size, (i + 1) * group_size)
        mean[s] = x[s].sum() / group_size
    x_centered = x - mean
    factor = torch.tensor(float(x.numel()), dtype=torch.float64)
    std = (((x - mean) ** 2).sum() / (factor - 1)).sqrt()
    return (x_centered / (std + eps)).float()


# --- ROLL (agentic_actor_pg_worker.py, _compute_topr_loss; per-token loss before agg_loss) ----------------------

def roll_topr_per_token(ratio, log_probs, advantages, scores, positive_weight, negative_weight):
    positive_mask = (scores > 0).float()
    negative_mask = (scores <= 0).float()
    positive_token_mask = positive_mask.unsqueeze(-1).expand_as(log_probs)
    negative_token_mask = negative_mask.unsqueeze(-1).expand_as(log_probs)
    positive_loss = -advantages * log_probs * positive_token_mask
    clipped_ratio = torch.clamp(ratio, min=0.0, max=1.0).detach()
    negative_loss = -clipped_ratio * advantages * log_probs * negative_token_mask
    return positive_weight * positive_loss + negative_weight * negative_loss
