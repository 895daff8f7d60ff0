"""Metrics and history files are strict JSON: a non-finite number (a diverged loss, an undefined metric) is null."""

from __future__ import annotations

import json
import math

from posttrain.runtime import strict_json


def test_non_finite_floats_become_null_at_any_depth_and_strict_parsers_accept_the_text():
    payload = {"loss": math.nan, "steps": 3.0, "history": [{"grad_norm": math.inf}, {"grad_norm": -math.inf, "ok": 1.5}], "t": (math.nan, 2)}
    text = strict_json(payload, sort_keys=True)
    assert "NaN" not in text and "Infinity" not in text
    strict = json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert strict == {"history": [{"grad_norm": None}, {"grad_norm": None, "ok": 1.5}], "loss": None, "steps": 3.0, "t": [None, 2]}


def test_finite_payloads_are_written_as_json_dumps_would():
    payload = {"a": [1, 2.5, "x"], "b": {"c": None, "d": True}}
    assert strict_json(payload, indent=2, sort_keys=True) == json.dumps(payload, indent=2, sort_keys=True)
