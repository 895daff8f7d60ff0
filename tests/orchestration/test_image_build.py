"""The image, built for real: docker/build_local.sh (podman on a debootstrap base; root) builds docker/Dockerfile and
runs the text pipeline's data and sft stages inside it with no network. About half an hour on 2 cores, so `heavy`
(`make test-heavy`), not part of `make test`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from helpers import REPO


@pytest.mark.heavy
def test_the_image_builds_and_runs_micro_stages_offline():
    missing = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    assert not missing and os.geteuid() == 0, f"needs root and {missing} (apt-get install podman runc debootstrap)"
    done = subprocess.run([str(REPO / "docker/build_local.sh")], cwd=REPO, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "IMAGE": "localhost/posttrain:test"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    metrics = json.loads(re.search(r"\{[^{}]*\"sft_loss\"[^{}]*\}", done.stdout).group(0))
    assert metrics["sft_loss"] > 0 and 0.0 <= metrics["sft_token_accuracy"] <= 1.0
    assert "its data and sft stages wrote" in done.stdout
