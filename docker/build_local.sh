#!/usr/bin/env bash
# Build docker/Dockerfile with Debian's podman where no container registry is reachable, then run one micro stage
# inside the image. The base image is made here: debootstrap writes a minimal Debian root file system, which
# `podman import` turns into an image; the Dockerfile builds on it with BASE set to that image.
#
#   docker/build_local.sh            (root; needs podman, runc and debootstrap: apt-get install podman runc debootstrap)
#
# What this sandbox needed, each found by trying (docs/orchestration.md, "The image"):
#   - runc instead of crun, podman's default: crun refuses hybrid cgroups v1/v2 ("cgroups in hybrid mode not supported");
#   - explicit --ulimit values no higher than the sandbox's: raising RLIMIT_NOFILE / RLIMIT_NPROC is not permitted;
#   - the host's network (--network host), and the host's CA bundle for pip behind the TLS-intercepting proxy;
#   - torch from the host's wheel folder (constraints.txt pins the CPU build, which PyPI does not serve).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/posttrain:cpu}
BASE_IMAGE=${BASE_IMAGE:-localhost/debian-local:bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
WHEELS=${WHEELS:-/opt/wheels}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
podman=(podman --runtime "${PODMAN_RUNTIME:-runc}")
limits=(--ulimit nofile=1024:1024 --ulimit nproc=1000:1000)

if ! "${podman[@]}" image exists "$BASE_IMAGE"; then
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  echo "debootstrap: a minimal Debian bookworm root file system from $MIRROR"
  debootstrap --variant=minbase bookworm "$root/rootfs" "$MIRROR" > "$root/debootstrap.log" 2>&1 \
    || { tail -n 20 "$root/debootstrap.log"; echo "debootstrap failed"; exit 1; }
  tar -C "$root/rootfs" -c . | "${podman[@]}" import - "$BASE_IMAGE"
fi

"${podman[@]}" build --network host "${limits[@]}" -v "$WHEELS:/wheels:ro" -v "$CA_BUNDLE:/ca.crt:ro" \
  --build-arg BASE="$BASE_IMAGE" --build-arg WHEELS=/wheels --build-arg CA_BUNDLE=/ca.crt \
  -f docker/Dockerfile -t "$IMAGE" .

# micro stages inside the image, with no network: the text pipeline's data and sft, writing to a host folder
out=$(mktemp -d)
run=("${podman[@]}" run --rm "${limits[@]}" --network none -v "$out:/work" -w /work "$IMAGE")
micro=(--params /opt/posttrain/params.yaml --set task.n_train=120 --set task.n_heldout=20 --set tracking.uri=sqlite:////work/mlflow.db
       --set tracking.artifact_root=/work/mlartifacts)
"${run[@]}" data "${micro[@]}" --out /work/outputs/data
"${run[@]}" sft "${micro[@]}" --set sft.steps=10 --set sft.batch_size=16 --set sft.n_examples=0 --set sft.warmup_steps=1 \
  --in data=/work/outputs/data --out /work/outputs/sft
cat "$out/outputs/sft/metrics.json"; echo
echo "image $IMAGE built; its data and sft stages wrote $out/outputs"
