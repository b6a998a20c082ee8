#!/usr/bin/env bash
# The README's main job: set everything up (idempotent), then run the node on a synthetic camera over
# loopback and print poses and cache diagnostics. Arguments go to lingbot_map_demo (see --help),
# e.g. `scripts/demo.sh --checkpoint /models/lingbot-map.pt --frames 100`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${LINGBOT_VENV:-$ROOT/.venv}
bash "$ROOT/scripts/setup_env.sh"
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST  # the demo sets it too; loopback only, always
exec "$VENV/bin/lingbot_map_demo" "$@"
