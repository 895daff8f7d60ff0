"""One-off check (not collected by pytest: verl is not a dependency): run verl 0.9.1's real functions from its
published wheel against ours and against the transcriptions in anchor_transcriptions.py.

    pip install --no-deps verl==0.9.1      # its package init imports ray and tensordict: never imported here
    OMP_NUM_THREADS=1 .venv/bin/python tests/unit/verl_original_check.py

The package's core_algos.py and rollout_corr_helper.py are loaded as module files, with stand-ins for the few
names they import from the rest of verl (torch_functional.py is loaded from the wheel too). Prints one line per
part: max |difference| of loss and gradient (or advantages / masks / weights) ours vs verl, transcription vs verl."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).parent))
import anchor_transcriptions as ref  # noqa: E402
import test_catalogue_parity as t  # noqa: E402


def load_verl():
    root = Path(importlib.util.find_spec("verl").submodule_search_locations[0])

    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        mod.__path__ = []
        sys.modules[name] = mod
        return mod

    def from_file(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    class ActorConfig(dict):  # stand-in: attribute access, .get, global_batch_info
        __getattr__ = dict.get

    module("tensordict", TensorDict=type("TensorDict", (dict,), {}))  # named in a type hint only
    module("verl")
    module("verl.utils.device", get_device_name=lambda: "cpu", get_torch_device=lambda: torch.cpu)
    module("verl.protocol", DataProto=type("DataProto", (), {}))
    module("verl.trainer.config.algorithm", RolloutCorrectionConfig=type("RolloutCorrectionConfig", (), {}))
    module("verl.workers.config.actor", PolicyLossConfig=type("PolicyLossConfig", (), {}))
    module("verl.utils", as_torch_index=None, group_mean_std=None)
    module("verl.utils.import_utils", deprecated=lambda *a, **k: (lambda f: f))
    module("verl.trainer")
    module("verl.trainer.ppo")
    module("verl.trainer.config", AlgoConfig=type("AlgoConfig", (dict,), {}))
    sys.modules["verl.trainer.config"].algorithm = sys.modules["verl.trainer.config.algorithm"]
    module("verl.workers")
    module("verl.workers.config", ActorConfig=ActorConfig)
    try:
        tf = from_file("verl.utils.torch_functional", root / "utils" / "torch_functional.py")
    except ImportError as e:  # it imports optional kernels at module level in some versions
        raise SystemExit(f"torch_functional.py did not load: {e}") from e
    sys.modules["verl.utils"].torch_functional = tf
    core = from_file("verl.trainer.ppo.core_algos", root / "trainer" / "ppo" / "core_algos.py")
    rc = from_file("verl.trainer.ppo.rollout_corr_helper", root / "trainer" / "ppo" / "rollout_corr_helper.py")
    return core, rc, ActorConfig


def main() -> None:
    core, rc, ActorConfig = load_verl()
    rows = []

    def actor(**kw):
        base = dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, global_batch_info={}, policy_loss=SimpleNamespace(**kw.pop("policy_loss", {})))
        return ActorConfig({**base, **kw})

    def loss_row(name, ours_fn, verl_name, verl_cfg, agg="token-mean", ref_fn=None, seed=0, spread=0.4, rng=None, adv_tokens=False):
        logp, old, mask, adv = t.batch_tensors(seed=seed, spread=spread)
        adv_t = adv[:, None].expand(t.B, t.T).clone()
        if rng is not None:
            torch.manual_seed(rng)
        ours = ours_fn(logp, old, adv, mask)
        if rng is not None:
            torch.manual_seed(rng)
        theirs, _ = core.get_policy_loss_fn(verl_name)(old, logp, adv_t, mask, loss_agg_mode=agg, config=verl_cfg)
        d_loss, d_grad = t.compare(ours, theirs, logp)
        line = f"{name:28s} ours vs verl: loss {d_loss:.2e} grad {d_grad:.2e}"
        if ref_fn is not None:
            if rng is not None:
                torch.manual_seed(rng)
            r_loss, r_grad = t.compare(ref_fn(logp, old, adv_t, mask), theirs, logp)
            line += f" | transcription vs verl: loss {r_loss:.2e} grad {r_grad:.2e}"
        rows.append(line)

    from posttrain.objectives import advantages, losses
    from posttrain.objectives.clip_cov import ClipCovOptions
    from posttrain.objectives.dppo import DPPOOptions
    from posttrain.objectives.dro import DROOptions
    from posttrain.objectives.dual_clip import DualClipOptions
    from posttrain.objectives.kl_cov import KLCovOptions
    from posttrain.objectives.reinforce_pp import ReinforcePPOptions
    from posttrain.objectives.sapo import SAPOOptions

    L = losses.get
    cfg = t.cfg_for
    loss_row("dual_clip (vanilla)", lambda lp, o, a, m: L("dual_clip")(lp, o, a, m, cfg(dual_clip=DualClipOptions(c=3.0)))[0],
             "vanilla", actor(clip_ratio_c=3.0), spread=1.5,
             ref_fn=lambda lp, o, a, m: ref.verl_vanilla(o, lp, a, m, "token-mean", 0.2, 0.28, 3.0))
    for kind in ("tv", "kl"):
        opts = DPPOOptions(delta_low=0.05, delta_high=0.08, cap=1.5)
        loss_row(f"dppo_{kind}", lambda lp, o, a, m, k=kind, op=opts: L(f"dppo_{k}")(lp, o, a, m, cfg(**{f"dppo_{k}": op}))[0],
                 f"dppo_{kind}", actor(clip_ratio_low=0.05, clip_ratio_high=0.08, clip_ratio_c=1.5), spread=0.6,
                 ref_fn=lambda lp, o, a, m, k=kind: ref.verl_dppo(o, lp, a, m, "token-mean", 0.05, 0.08, 1.5, k))
    loss_row("sapo", lambda lp, o, a, m: L("sapo")(lp, o, a, m, cfg("seq_mean", sapo=SAPOOptions(tau_pos=1.0, tau_neg=1.05)))[0],
             "sapo", actor(tau_pos=1.0, tau_neg=1.05), ref_fn=lambda lp, o, a, m: ref.verl_sapo(o, lp, a, m, 1.0, 1.05))
    loss_row("gpg (loss)", lambda lp, o, a, m: L("gpg")(lp, o, a, m, cfg())[0], "gpg", actor(),
             ref_fn=lambda lp, o, a, m: ref.verl_gpg(lp, a, m, "token-mean"))
    loss_row("kl_cov", lambda lp, o, a, m: L("kl_cov")(lp, o, a, m, cfg(kl_cov=KLCovOptions(ratio=0.1, coef=1.0)))[0],
             "kl_cov", actor(policy_loss=dict(kl_cov_ratio=0.1, ppo_kl_coef=1.0)),
             ref_fn=lambda lp, o, a, m: ref.verl_kl_cov(o, lp, a, m, "token-mean", 0.1, 1.0))
    loss_row("geo_mean (GMPO)", lambda lp, o, a, m: L("geo_mean")(lp, o, a, m, cfg("seq_mean", low=0.4, high=0.4))[0],
             "geo_mean", actor(clip_ratio=0.4, clip_ratio_low=0.4, clip_ratio_high=0.4),
             ref_fn=lambda lp, o, a, m: ref.verl_geo_mean(o, lp, a, m, 0.4, 0.4))
    loss_row("dro", lambda lp, o, a, m: L("dro")(lp, o, a, m, cfg(dro=DROOptions(beta=0.3)))[0], "dro",
             actor(policy_loss=dict(dro_beta=0.3)), ref_fn=lambda lp, o, a, m: ref.verl_dro(o, lp, a, m, "token-mean", 0.3))

    # the clip_cov case with verl's own pre-scaled advantages (a * 3) for the verl call
    logp, old, mask, adv = t.batch_tensors(spread=0.1)
    torch.manual_seed(7)
    ours = L("clip_cov")(logp, old, adv * 3, mask, cfg(clip_cov=ClipCovOptions(ratio=0.1, lb=0.2, ub=5.0)))[0]
    torch.manual_seed(7)
    theirs, _ = core.get_policy_loss_fn("clip_cov")(old, logp, (adv * 3)[:, None].expand(t.B, t.T).clone(), mask, loss_agg_mode="token-mean",
                                                    config=actor(policy_loss=dict(clip_cov_ratio=0.1, clip_cov_lb=0.2, clip_cov_ub=5.0)))
    torch.manual_seed(7)
    tr = ref.verl_clip_cov(old, logp, (adv * 3)[:, None].expand(t.B, t.T).clone(), mask, "token-mean", 0.2, 0.28, 0.1, 0.2, 5.0)
    d, g = t.compare(ours, theirs, logp)
    rd, rg = t.compare(tr, theirs, logp)
    rows.append(f"{'clip_cov':28s} ours vs verl: loss {d:.2e} grad {g:.2e} | transcription vs verl: loss {rd:.2e} grad {rg:.2e}")

    # estimators
    import numpy as np
    index = np.array(t.GROUP)
    batch = t.reward_batch(t.SCORES, t.GROUP, t.LENGTHS)
    rm = batch.completion_mask.float()
    token_rewards = torch.zeros(len(t.SCORES), t.T)
    token_rewards[torch.arange(len(t.SCORES)), torch.tensor(t.LENGTHS) - 1] = torch.tensor(t.SCORES)

    def est_row(name, ours, theirs, transcription):
        theirs = theirs if theirs.dim() == 1 else (theirs * rm).sum(-1) / rm.sum(-1)
        rows.append(f"{name:28s} ours vs verl: {float((ours - theirs).abs().max()):.2e} | transcription vs verl: "
                    f"{float((transcription - theirs).abs().max()):.2e}")

    algo = SimpleNamespace(get=lambda k, d=None: {"norm_adv_by_std_in_grpo": True}.get(k, d))
    theirs, _ = core.compute_grpo_passk_outcome_advantage(token_rewards, rm, index, epsilon=1e-6, config=algo)
    est_row("grpo_passk", advantages.get("grpo_passk")(batch, SimpleNamespace(std_scaling="group", std_eps=1e-6)), theirs,
            ref.verl_grpo_passk(torch.tensor(t.SCORES), t.GROUP, 1e-6, True))
    theirs, _ = core.compute_reinforce_plus_plus_baseline_outcome_advantage(token_rewards, rm, index)
    ours = advantages.get("reinforce_pp")(batch, SimpleNamespace(std_eps=1e-12, options_for=lambda n: ReinforcePPOptions(whiten="tokens")))
    rows.append(f"{'reinforce_plus_plus_baseline':28s} ours vs verl: {float(((ours - theirs) * rm).abs().max()):.2e} | transcription vs verl: "
                f"{float(((ref.verl_reinforce_pp_baseline(torch.tensor(t.SCORES), rm, t.GROUP) - theirs) * rm).abs().max()):.2e}")
    theirs, _ = core.compute_opo_outcome_advantage(token_rewards, rm, index)
    est_row("opo", advantages.get("opo")(batch, SimpleNamespace()), theirs, ref.verl_opo(torch.tensor(t.SCORES), rm, t.GROUP))
    theirs, _ = core.compute_gpg_outcome_advantage(token_rewards, rm, index)
    est_row("gpg (advantage)", advantages.get("gpg")(batch, SimpleNamespace()), theirs, ref.verl_gpg_advantage(torch.tensor(t.SCORES), t.GROUP))

    # rollout correction
    from posttrain.objectives.icepop import IcePopOptions
    from posttrain.objectives.off_policy import corrections
    from posttrain.objectives.rejection import RejectionOptions
    behaviour, proximal, mask = t.mismatch()
    lr = (proximal - behaviour) * mask
    for mode, low, high in [("token_k1", 0.7, 1.4), ("token_k3", 1.0, 0.05), ("seq_sum_k1", 0.5, 2.0), ("seq_mean_k3", 1.0, 0.05), ("seq_max_k2", 1.0, 0.2)]:
        spec = f"{low}_{high}" if mode.endswith("k1") else high
        theirs, _ = rc.compute_rollout_rejection_mask(lr, mask, rollout_rs=mode, rollout_rs_threshold=spec)
        ours = corrections.get("rejection")(behaviour, proximal, mask, RejectionOptions(mode=mode, low=low, high=high)).mask
        tr = ref.verl_rejection_mask(lr, mask, mode, low, high)
        rows.append(f"{'rejection ' + mode:28s} ours == verl: {bool(torch.equal(ours, theirs))} | transcription == verl: {bool(torch.equal(tr, theirs))}"
                    f" (rejected {float(((mask - theirs) > 0).sum())}/{float(mask.sum())})")
    theirs, _ = rc.compute_rollout_correction_weights(lr, mask, rollout_is="token", rollout_is_threshold="0.8_1.25")
    ours = corrections.get("icepop")(behaviour, proximal, mask, IcePopOptions(low=0.8, high=1.25)).weight
    rows.append(f"{'icepop':28s} ours vs verl: {float((ours - theirs).abs().max()):.2e} | transcription vs verl: "
                f"{float((ref.verl_icepop_weights(lr, mask, 0.8, 1.25) - theirs).abs().max()):.2e}")
    print("verl 0.9.1 original functions (core_algos.py, rollout_corr_helper.py) on the test batches:")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
