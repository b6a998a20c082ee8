"""The README and docs/ are a manual and a reference, not a lab notebook.

No prose in README.md or docs/*.md names a development session ("eleventh session"), a device call
("call 3"), an issue of the project's tracker ("issue 21", "#21") or says "now X (was Y)"; dated lab
notes ("Measured on 2026-12-01", a heading with a date), "53.3, now 38.1" and "the submitted code"
are diary too. History lives only in
docs/history.md, measurements in docs/perf/runs/ (rendered into docs/performance.md).

"session" is also a product word (a saved map session, "start a new session"), so the session
patterns are narrow: an ordinal right before "session", or "session of <year>". A bare ``#N`` is a
tracker reference; an upstream one names its repository (``lingbot-map#53``) and is allowed, and
``§16 #3`` (docs/model.md's numbered list of official defects) is not a tracker reference.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[1]
HISTORY = REPO / "docs" / "history.md"

ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth")
DATE = r"20\d\d-\d\d-\d\d"
DIARY: dict[str, re.Pattern] = {
    "a development session": re.compile(rf"\b(?:{ORDINALS}|\d+(?:st|nd|rd|th))(?: development| device)? session\b",
                                        re.I),
    "a dated session": re.compile(r"\bsession of 20\d\d\b", re.I),
    "a device call": re.compile(r"\bcalls? \d+\b", re.I),
    "an issue number": re.compile(r"\bissues? #?\d+\b", re.I),
    "a bare #N tracker reference": re.compile(r"(?<![\w&/#])#\d+\b"),
    "now X (was Y)": re.compile(r"\bnow\b(?:[^.]|\.\d)*\(was\b", re.I),  # a decimal point does not end it
    "(was Y)": re.compile(r"\((?:[^()]*[;,] )?was \d"),
    "Y, now X": re.compile(r",\s+now \*{0,2}\d", re.I),
    "the submitted code": re.compile(r"\bsubmitted code\b", re.I),
    "a dated lab note": re.compile(rf"\b(?:measured|run|tried|checked) (?:on |in )?(?:the )?{DATE}|\({DATE}\b", re.I),
    "a dated heading": re.compile(rf"^#{{1,6}} .*\b{DATE}"),
}
# docs/model.md numbers the official code's defects (§16) and cites them as "§16 #3".
SECTION_ITEM = re.compile(r"§\d+(?:\.\d+)*\s+#\d+")


class Hit(NamedTuple):
    line: int
    why: str
    text: str


def diary_lines(text: str) -> list[Hit]:
    """Every line of ``text`` that reads like a lab notebook, with the pattern it matched."""
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        scanned = SECTION_ITEM.sub("§", line)
        for why, pattern in DIARY.items():
            if pattern.search(scanned):
                hits.append(Hit(number, why, line.strip()))
    return hits


def documents() -> list[Path]:
    """README.md and docs/*.md (docs/history.md is the one place for history)."""
    return [REPO / "README.md"] + sorted(p for p in (REPO / "docs").glob("*.md") if p != HISTORY)


def test_readme_and_docs_read_as_a_manual():
    found = [f"{path.relative_to(REPO)}:{hit.line}: {hit.why}: {hit.text[:140]}"
             for path in documents() for hit in diary_lines(path.read_text(encoding="utf-8"))]
    assert not found, "diary in the manual (move it to docs/history.md or a commit message):\n" + "\n".join(found)


def test_the_scan_covers_the_readme_and_every_doc_but_history():
    names = {p.relative_to(REPO).as_posix() for p in documents()}
    assert "README.md" in names and "docs/architecture.md" in names and "docs/performance.md" in names
    assert "docs/history.md" not in names
    assert len(names) == 1 + len(list((REPO / "docs").glob("*.md"))) - 1


# ------------------------------------------------------------------------------------ the checker itself


@pytest.mark.parametrize("line, why", [
    ("## 2026-12-04, eleventh session: the host's plan behind the encoder", "a development session"),
    ("The run of record (eleventh session): NVIDIA H200", "a development session"),
    ("as the 12th session measured", "a development session"),
    ("Until the session of 2026-12-01 the README was long", "a dated session"),
    ("| 3 | `record11` at d8dde96 | the run of record |, then call 4 on the same machine", "a device call"),
    ("(calls 2 and 3)", "a device call"),
    ("### Where issue 21 stands after this session", "an issue number"),
    ("fixed for #21 last week", "a bare #N tracker reference"),
    ("see (#35)", "a bare #N tracker reference"),
    ("| 518 | 9.0 / 29.1 | 13.9 / 53.3, now **38.1** (was 53.3) |", "now X (was Y)"),
    ("36.70 ms (27.2 FPS; was 44.2)", "(was Y)"),
    ("| 518 | 9.0 / 29.1 | 13.9 / 53.3, now **38.1** (518×378: 30.9) |", "Y, now X"),
    ("| the submitted code (GEMV tiles on top) | 208 | 25.46 |", "the submitted code"),
    ("Measured on 2026-12-01 on a 2-vCPU VM shared with other jobs", "a dated lab note"),
    ("on this 2-core CPU (2026-12-01, tiny preset)", "a dated lab note"),
    ("## Speed on the H200: first run of record 2026-12-01", "a dated heading"),
])
def test_a_planted_diary_line_is_found(line, why):
    assert why in {hit.why for hit in diary_lines(line)}, diary_lines(line)


@pytest.mark.parametrize("line", [
    "`~/reset` starts a new session: KV cache emptied, new world frame",
    "A saved session loaded at configure: the node resumes in its world.",
    "of every frame stored in this session. With `m` stored phase-2 frames",
    "the first frame of a session is its world frame; a call of 8 frames at a time",
    "ros2 service call /lingbot_map/save_session std_srvs/srv/Trigger",
    "shape error once 1024 frames are stored (§16 #3). This package never asks",
    "a defect upstream (lingbot-map#53) that the official code still has",
    "[pose] #  0 s0 t=1796163343.421 lingbot_world: p=(-0.015,-0.090,+0.049)",
    "| 518×378 | depth + camera | ours, the default kernels | 25.39 | 26.06 | 2026-12-04 `d8dde96` |",
    "the colour &#35; and a hex colour #1e90ff in a config",
    "the issue of a frame's stamps is explained below; it was 2 s late",
])
def test_product_prose_is_not_flagged(line):
    assert diary_lines(line) == []


def test_a_planted_line_in_the_real_readme_is_found_at_its_line():
    text = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    at = len(text) // 2
    planted = "\n".join(text[:at] + ["The run of record (twelfth session), call 4: now 25.1 ms (was 25.4)."]
                        + text[at:])
    hits = diary_lines(planted)
    assert {hit.line for hit in hits} == {at + 1}
    assert {hit.why for hit in hits} == {"a development session", "a device call", "now X (was Y)", "(was Y)"}
