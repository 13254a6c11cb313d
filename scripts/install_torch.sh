#!/usr/bin/env bash
# Install the right torch build into the course's venv: the CPU build where no NVIDIA GPU is visible,
# the CUDA build otherwise. COURSE_TORCH=cpu|cuda|keep overrides; TORCH_VERSION picks the release.
set -euo pipefail
PY=${1:?usage: install_torch.sh PATH/TO/python}
VERSION=${TORCH_VERSION:-2.13.0}
VARIANT=${COURSE_TORCH:-auto}
CPU_INDEX=https://download.pytorch.org/whl/cpu

if [ "$VARIANT" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then VARIANT=cuda; else VARIANT=cpu; fi
fi
have=$("$PY" -c 'import torch; print("cuda" if torch.version.cuda else "cpu", torch.__version__)' 2>/dev/null || true)
case "$VARIANT" in
  keep) echo "torch: keeping the installed build (${have:-none})"; exit 0 ;;
  cpu|cuda) ;;
  *) echo "COURSE_TORCH must be cpu, cuda, keep or unset (auto); got '$VARIANT'" >&2; exit 2 ;;
esac
if [ "${have%% *}" = "$VARIANT" ]; then echo "torch: $have already installed"; exit 0; fi

echo "torch: installing the $VARIANT build of torch $VERSION"
if [ "$VARIANT" = cpu ]; then
  # The CPU wheel index keeps a CPU box from downloading the multi-GB CUDA build; if it cannot be
  # reached (an offline mirror), the default index is tried next.
  "$PY" -m pip install --quiet "torch==$VERSION" --index-url "$CPU_INDEX" --retries 0 --timeout 15 2>/dev/null \
    || "$PY" -m pip install --quiet "torch==$VERSION"
else
  "$PY" -m pip install --quiet "torch==$VERSION"
fi
