"""Run a check script of this folder in a child process under Triton's interpreter (``TRITON_INTERPRET=1``
is read when Triton is imported, so it cannot be switched on inside the test process) and return the
JSON report it prints last."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_interpreted(script_name: str) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    script = Path(__file__).with_name(script_name)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
