"""The GPU run's figures as one Markdown table (benchmarks/gpu_run.sh writes them; docs/speed.md quotes it).

    python benchmarks/gpu_summary.py OUT_DIR     # reads gpu-tests.xml and grpo_*.json there
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def test_counts(xml: Path) -> str:
    if not xml.exists():
        return "tests/gpu: no report (the run did not reach or finish them)"
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    total, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase") if c.find("failure") is not None or c.find("error") is not None]
    line = f"tests/gpu: {total - failures - errors - skipped} passed, {failures} failed, {errors} errors, {skipped} skipped ({suite.get('time')} s)"
    return line + "".join(f"\n  - FAILED {name}" for name in failed)


def row(result: dict) -> str:
    s = result["settings"]
    graph = result.get("ours_graph_rollout_tok_s")
    return (
        f"| {result['shape']} | {s['parameters'] / 1e6:.0f}M ({s['linear_parameters'] / 1e6:.0f}M matmul), vocab {result['vocab_size']:,}, "
        f"{s['model']['dtype']} | {s['prompts_per_step']} x G={s['group_size']} x {s['max_new_tokens']} "
        f"| {result['hf_rollout_tok_s']:,.0f} | {result['ours_rollout_tok_s']:,.0f} | {f'{graph:,.0f}' if graph else 'n/a'} "
        f"| {result['trl_step_s']:.2f} | {result['ours_step_s']:.2f} | {result['step_ratio']:.3f} "
        f"| {result['update_mfu']:.1%} | {result['roofline_flop_s'] / 1e12:.0f} |"
    )


def main(out: str) -> int:
    out_dir = Path(out)
    print(test_counts(out_dir / "gpu-tests.xml"))
    results = [json.loads(p.read_text()) for p in sorted(out_dir.glob("grpo_*.json"))]
    if not results:
        print("no benchmark results")
        return 0
    first = results[0]
    versions = first["settings"]["versions"]
    print(f"\n{first['device']}; torch {versions['torch']}, transformers {versions['transformers']}, trl {versions['trl']}\n")
    print("| shape | model | batch | generate tok/s | ours tok/s | ours + CUDA graphs tok/s | TRL step s | ours step s "
          "| step ratio (ours/TRL) | update MFU | matmul peak TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for result in results:
        print(row(result))
    for result in results:
        if "gpu_targets" in result and result["shape"] == "anchor":
            met = {k: result[f"gpu_{k}_target_met"] for k in ("step", "rollout", "mfu")}
            print(f"\nanchor targets (step <= 0.2x TRL, rollout >= 30,000 tok/s, update MFU >= 40%): {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "outputs/gpu"))
