#!/usr/bin/env bash
# Install the right torch build into the course's venv: the CPU build where no NVIDIA GPU is visible, else
# the newest CUDA build the NVIDIA driver can run, and say in one line which build and why.
#
#   bash scripts/install_torch.sh PATH/TO/python             # what `make setup` runs
#   bash scripts/install_torch.sh PATH/TO/python --dry-run   # print the choice and the pip command only
#
# COURSE_TORCH=cpu|cuda|keep overrides (keep: leave the installed torch alone, e.g. on Colab). A conda
# environment's own torch (conda-forge's pytorch: `make lab VENV=$CONDA_PREFIX`) is kept unless COURSE_TORCH
# names a build. On macOS, torch >= 2.12 ships wheels for Apple silicon on macOS 14+ only: elsewhere it says
# so and what to use instead, and stops.
# COURSE_TORCH_BUILD=cu126 (any tag of download.pytorch.org/whl) forces a CUDA build of TORCH_VERSION;
# TORCH_VERSION picks the release (default 2.13.0, the course's pin).
#
# The rule (NVIDIA's CUDA compatibility guide, "minor version compatibility", and the CUDA toolkit release
# notes' minimum-driver table): a build for CUDA major M runs on any driver of major >= M that meets M's
# minimum, Linux x86-64: CUDA 13.x >= 580.65.06, CUDA 12.x >= 525.60.13, CUDA 11.x >= 450.80.02. A build also
# needs kernels for the GPU's architecture (torch's RELEASE.md, "PyTorch CUDA Support Matrix").
set -euo pipefail
PY=${1:?usage: install_torch.sh PATH/TO/python [--dry-run]}
DRY_RUN=0
[ "${2:-}" = --dry-run ] && DRY_RUN=1
VERSION=${TORCH_VERSION:-2.13.0}
VARIANT=${COURSE_TORCH:-auto}
ASKED=${COURSE_TORCH:-}
FORCED_BUILD=${COURSE_TORCH_BUILD:-}
INDEX=https://download.pytorch.org/whl
FLOOR=2.7.1  # the oldest torch the course supports (ci/constraints-floor.txt): its builds are the fallback

# CUDA builds, preferred first: torch version, tag, minimum driver (Linux), compute capabilities covered
# (x10; 999: +PTX, later architectures JIT-compile). Torch 2.13 publishes cu126, cu130 and an experimental
# cu132 (not picked; COURSE_TORCH_BUILD=cu132 to opt in); 2.7 was the last with cu118, and had cu128.
BUILDS="
2.13.0 cu130 580.65.06 75 999
2.13.0 cu126 525.60.13 50 90
$FLOOR cu128 525.60.13 75 120
$FLOOR cu118 450.80.02 37 90
"

ver_ge() {  # ver_ge A B: version A >= version B
  [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$2" ]
}

run() {  # run a command, or print it in a dry run
  if [ "$DRY_RUN" = 1 ]; then printf 'would run:'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; }

if [ "$VARIANT" = auto ]; then
  if has_gpu; then VARIANT=cuda; else VARIANT=cpu; fi
fi
# what is installed: "cpu 2.13.0" or "cu126 2.13.0" (the local "+cu126" suffix dropped)
have=$("$PY" -c 'import torch; c = torch.version.cuda
print(("cu" + c.replace(".", "")) if c else "cpu", torch.__version__.split("+")[0])' 2>/dev/null || true)
case "$VARIANT" in
  keep) echo "torch: keeping the installed build (${have:-none})"; exit 0 ;;
  cpu|cuda) ;;
  *) echo "COURSE_TORCH must be cpu, cuda, keep or unset (auto); got '$VARIANT'" >&2; exit 2 ;;
esac

# conda: the environment's own pytorch (conda chose its CPU or CUDA build for this machine) stays
prefix=$("$PY" -c 'import sys; print(sys.prefix)' 2>/dev/null || true)
if [ -z "$ASKED" ] && [ -n "$prefix" ] && compgen -G "$prefix/conda-meta/pytorch-[0-9]*.json" >/dev/null; then
  echo "torch: keeping conda's pytorch (${have:-installed}) in $prefix: conda picked its build for this machine" \
    "(COURSE_TORCH=cpu|cuda replaces it with pip's)"
  exit 0
fi

# macOS: torch >= 2.12 has wheels for Apple silicon on macOS 14 or later only
if [ "$(uname -s 2>/dev/null || true)" = Darwin ]; then
  arch=$(uname -m 2>/dev/null || true) macos=$(sw_vers -productVersion 2>/dev/null || echo unknown)
  if [ "$arch" != arm64 ] || ! ver_ge "$macos" 14; then
    echo "torch: torch $VERSION has no wheel for macOS $macos on $arch (Apple silicon with macOS 14 or later" \
      "only). Use Colab or Kaggle (README.md), a Linux machine, or WSL 2 on Windows; COURSE_TORCH=keep keeps a" \
      "torch you installed yourself, untested" >&2
    exit 3
  fi
fi

tag=cpu why="no NVIDIA GPU visible (nvidia-smi)"
[ -n "$ASKED" ] && why="COURSE_TORCH=$ASKED"
if [ "$VARIANT" = cuda ]; then
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' ' || true)
  # compute capability of every GPU as x10 ("7.5" -> 75); drivers before ~510 cannot report it
  caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | grep -E '^[0-9]+$' || true)
  cap_lo=$(printf '%s\n' $caps | sort -n | head -n1) cap_hi=$(printf '%s\n' $caps | sort -n | tail -n1)
  seen="driver ${driver:-unknown}"
  [ -n "$cap_lo" ] && seen="$seen, compute capability $((cap_lo / 10)).$((cap_lo % 10))"
  [ -n "$cap_hi" ] && [ "$cap_hi" != "$cap_lo" ] && seen="$seen to $((cap_hi / 10)).$((cap_hi % 10))"
  if [ -n "$FORCED_BUILD" ]; then
    tag=$FORCED_BUILD why="COURSE_TORCH_BUILD=$FORCED_BUILD ($seen)"
  elif [ -z "$driver" ]; then
    # COURSE_TORCH=cuda on a machine whose driver cannot be read: the default index's build
    tag=default why="COURSE_TORCH=cuda, but nvidia-smi reports no driver version: the default index's CUDA build"
  else
    skipped=""
    while read -r v t min lo hi; do
      [ -z "$v" ] && continue
      if [ "$v" != "$VERSION" ] && [ "$v" != "$FLOOR" ]; then continue; fi
      if ! ver_ge "$driver" "$min"; then skipped="$skipped; $t needs driver >= $min"; continue; fi
      if [ -n "$cap_lo" ] && { [ "$cap_lo" -lt "$lo" ] || [ "$cap_hi" -gt "$hi" ]; }; then
        skipped="$skipped; $t has no kernels for this GPU"; continue
      fi
      tag=$t
      rule="a CUDA ${t:2:2}.x build runs on any driver >= $min"
      why="$seen -> torch $v $t ($rule${skipped})"
      [ "$v" != "$VERSION" ] && why="$why; no build of torch $VERSION runs here, $v is the course's oldest"
      VERSION=$v
      break
    done <<< "$BUILDS"
    if [ "$tag" = cpu ]; then
      why="$seen: no CUDA build of torch $FLOOR..$VERSION runs here (${skipped#; }): update the NVIDIA driver"
      if [ -n "$ASKED" ]; then echo "torch: COURSE_TORCH=cuda, but $why" >&2; exit 3; fi
      why="$why; the CPU build for now"
    fi
  fi
fi

# Installed already: the chosen CUDA build of this version; any CPU build for the CPU (as before); any CUDA
# build where the driver's build could not be chosen.
kind=${have%% *}
if [ "$have" = "$tag $VERSION" ] || { [ "$tag" = cpu ] && [ "$kind" = cpu ]; } \
   || { [ "$tag" = default ] && [ -n "$have" ] && [ "$kind" != cpu ]; }; then
  echo "torch: the $kind build of torch ${have#* } is already installed ($why)"
  exit 0
fi
echo "torch: installing the $tag build of torch $VERSION: $why"
# --no-compile: pip byte-compiles one file at a time (torch and its dependencies: about 30 s on two cores);
# `make setup` byte-compiles everything on every core afterwards (the Makefile), Python on first import otherwise
if [ "$tag" = cpu ]; then
  # The CPU wheel index keeps a CPU box from downloading the multi-GB CUDA build; if it cannot be
  # reached (an offline mirror), the default index is tried next.
  run "$PY" -m pip install --quiet --no-compile "torch==$VERSION" --index-url "$INDEX/cpu" --retries 0 \
    --timeout 15 2>/dev/null || run "$PY" -m pip install --quiet --no-compile "torch==$VERSION"
elif [ "$tag" = default ]; then
  run "$PY" -m pip install --quiet --no-compile "torch==$VERSION"
else
  run "$PY" -m pip install --quiet --no-compile "torch==$VERSION" --index-url "$INDEX/$tag"
fi
