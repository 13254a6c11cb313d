#!/usr/bin/env bash
# Entrypoint of the course image (docker/Dockerfile). `lab` (the default) copies the lessons into
# $WORKSPACE/my-lessons (mounted from the host; as `make lab` does: new lessons copied in, your edits never
# overwritten) and starts Jupyter Lab there with token authentication; anything else runs as given (e.g.
# `make test`, `bash`).
#
# JUPYTER_TOKEN  the token Lab asks for; unset or empty -> a random one (an empty token would switch
#                authentication off, so it is never used). Jupyter prints the URL with the token.
# LAB_PORT       Lab's port inside the container (8888). Lab binds 0.0.0.0 here, inside the container
#                only: publish it on the host's loopback, `-p 127.0.0.1:8888:8888`.
# ENABLE_SSH=1   also start sshd on port 2222 as this user, keys only: SSH_AUTHORIZED_KEYS (public keys,
#                one a line) or a mounted ~/.ssh/authorized_keys; no keys -> refuse to start.
# COURSE_ENTRYPOINT_DRY_RUN=1  print what would run instead of running it (tests/test_docker.py).
set -euo pipefail

WORKSPACE=${WORKSPACE:-/workspace}
LAB_PORT=${LAB_PORT:-8888}
PY=${VENV:-/opt/venv}/bin/python
SSHD_CONFIG=${SSHD_CONFIG:-/etc/ssh/course_sshd_config}
DRY_RUN=${COURSE_ENTRYPOINT_DRY_RUN:-0}

run() {  # run (or, in a dry run, print) a command
  if [ "$DRY_RUN" = 1 ]; then printf 'would run:'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

start_sshd() {
  local ssh_dir="$HOME/.ssh"
  mkdir -p "$ssh_dir" && chmod 700 "$ssh_dir"
  if [ -n "${SSH_AUTHORIZED_KEYS:-}" ]; then
    printf '%s\n' "$SSH_AUTHORIZED_KEYS" >> "$ssh_dir/authorized_keys"
  fi
  if ! grep -qE '^(ssh-|ecdsa-|sk-)' "$ssh_dir/authorized_keys" 2>/dev/null; then
    echo "ENABLE_SSH=1 but no public key: set SSH_AUTHORIZED_KEYS or mount ~/.ssh/authorized_keys." \
         "SSH never accepts passwords here." >&2
    exit 2
  fi
  chmod 600 "$ssh_dir/authorized_keys"
  local host_key="$ssh_dir/ssh_host_ed25519_key"  # per container unless the home is mounted
  [ -f "$host_key" ] || run ssh-keygen -q -t ed25519 -N '' -f "$host_key"
  run /usr/sbin/sshd -f "$SSHD_CONFIG" -h "$host_key"
  echo "sshd: listening on port 2222 for $(id -un), public keys only"
}

if [ "${ENABLE_SSH:-0}" = 1 ]; then
  start_sshd
fi

if [ "${1:-lab}" != lab ]; then
  if [ "$DRY_RUN" = 1 ]; then run "$@"; exit 0; fi
  exec "$@"
fi

if [ -z "${JUPYTER_TOKEN:-}" ]; then
  JUPYTER_TOKEN=$("$PY" -c 'import secrets; print(secrets.token_hex(24))')
  # Jupyter masks a token that comes from the environment in its log: say it once here.
  echo "Jupyter Lab token: $JUPYTER_TOKEN  (open http://127.0.0.1:$LAB_PORT/lab?token=$JUPYTER_TOKEN," \
       "with the port published on the host)"
fi
export JUPYTER_TOKEN  # Jupyter reads it from the environment, so it never shows in `ps`
# your copy of the lessons: the image's notebooks/ stay as released, your edits live on the host
run "$PY" "$WORKSPACE/scripts/copy_lessons.py" "$WORKSPACE/notebooks" "$WORKSPACE/my-lessons"
lab=("$PY" -m jupyter lab --notebook-dir="$WORKSPACE/my-lessons" --ServerApp.ip=0.0.0.0
     --ServerApp.port="$LAB_PORT" --no-browser)
if [ "$DRY_RUN" = 1 ]; then
  echo "token: ${#JUPYTER_TOKEN} characters"
  run "${lab[@]}"
  exit 0
fi
exec "${lab[@]}"
