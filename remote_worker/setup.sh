#!/usr/bin/env bash
# Machine B, thin wrapper around `python -m remote_worker`:
#   remote_worker/setup.sh --head 192.168.100.1:6379 --model-path /models/MiniMax-H3 --iface enp1s0f0np0 \
#       --token-file ~/.ray/auth_token
#   remote_worker/setup.sh status | stop | preflight ... | install-service ...
# Python: $PYTHON, else this checkout's .venv, else python3.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$HERE/.venv/bin/python" ]; then PY="$HERE/.venv/bin/python"; else PY="python3"; fi
fi
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
case "${1:-}" in
  setup|preflight|status|stop|install-service|-h|--help) exec "$PY" -m remote_worker "$@" ;;
  *) exec "$PY" -m remote_worker setup "$@" ;;
esac
