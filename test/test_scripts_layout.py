"""The lab stays out of the product: every script outside the package is documented, and the GPU
machine's driver keeps a handful of modes (the steps of a run of record are arguments, not modes)."""
from __future__ import annotations

import re

from test_docs_prose import REPO, documents

MAX_DEVICE_MODES = 5


def documentation() -> str:
    """The manual's pages (the README and docs/ but history, as the prose scan reads them) and bench's README."""
    return "\n".join(p.read_text() for p in [*documents(), REPO / "bench" / "README.md"])


def test_every_script_and_bench_is_named_in_the_docs() -> None:
    docs = documentation()
    scripts = [p for folder in ("scripts", "bench") for p in sorted((REPO / folder).iterdir())
               if p.is_file() and p.name != "README.md"]
    assert scripts, "no scripts found: the layout moved"
    undocumented = [str(p.relative_to(REPO)) for p in scripts if p.name not in docs]
    assert not undocumented, f"scripts no README or docs page names: {undocumented}"


def test_device_run_has_at_most_five_modes() -> None:
    text = (REPO / "scripts" / "device_run.sh").read_text()
    body = text.split('case "$MODE" in', 1)[1].split("\nesac", 1)[0]
    modes = re.findall(r"^([a-z][a-z0-9-]*)\)", body, flags=re.M)
    assert modes and len(modes) <= MAX_DEVICE_MODES, modes
