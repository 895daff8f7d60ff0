"""The Docker image's install step, checked without Docker (no daemon here): the GPU variant's constraint edit
must turn the frozen CPU-index torch pin into the PyPI version pyproject.toml asks for."""

from __future__ import annotations

import re
import subprocess

from helpers import REPO

DOCKERFILE = (REPO / "docker" / "Dockerfile").read_text()


def test_gpu_build_pins_the_pypi_torch_that_pyproject_names(tmp_path):
    sed = re.search(r"elif \[ -z \"\$WHEELS\" \]; then (sed -i '[^']+' constraints\.txt);", DOCKERFILE)  # no local wheels: PyPI's torch
    assert sed, "the GPU branch of the install step edits constraints.txt"
    constraints = tmp_path / "constraints.txt"
    constraints.write_text((REPO / "constraints.txt").read_text())
    subprocess.run(sed.group(1), shell=True, cwd=tmp_path, check=True)
    (pin,) = [line for line in constraints.read_text().splitlines() if line.startswith("torch==")]
    wanted = re.search(r'"(torch==[^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert pin == wanted
    assert "+" not in pin  # PyPI carries no local version labels


def test_image_installs_the_package_and_runs_posttrain():
    assert "pip install -c constraints.txt ." in DOCKERFILE
    assert 'ENTRYPOINT ["posttrain"]' in DOCKERFILE
    assert "COPY recipes ./recipes" in DOCKERFILE  # a recipe DAG's pods read its params file (recipes/rlhf/params.yaml)
    assert "ARG BASE=" in DOCKERFILE and "ARG TORCH_INDEX_URL" in DOCKERFILE  # CUDA base by default, CPU variant by args
    assert "ARG WHEELS=" in DOCKERFILE and "ARG CA_BUNDLE=" in DOCKERFILE  # docker/build_local.sh: local torch wheel, proxy CA
