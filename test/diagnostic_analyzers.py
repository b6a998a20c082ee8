"""diagnostic_aggregator's GenericAnalyzer matching, as documented, for checking config/diagnostic_aggregator.yaml.

diagnostic_aggregator is C++ and not installable in the pip environment, so the tests apply its
documented rules to the status names the node really publishes. The rules (class documentation of
``diagnostic_aggregator::GenericAnalyzer``, Jazzy, and ``GenericAnalyzer::match`` /
``removeLeadingNameChaff`` / ``getOutputName`` of the ros2-jazzy sources):

* ``contains``: the name contains the value; ``startswith``: the name starts with it;
  ``name``: exact match; ``expected``: exact match, and a missing one is reported (the group turns
  ERROR, or STALE when all its items are stale); ``regex``: the whole name matches
  (``std::regex_match``); ``find_and_remove_prefix``: ``startswith`` plus ``remove_prefix``.
  Values may be a string or a list of strings in the documentation, but the Jazzy code reads
  ``startswith``, ``contains``, ``remove_prefix`` and ``find_and_remove_prefix`` with
  ``as_string_array()`` (a plain string throws), so the shipped file must use lists.
* Output name: ``<path>/<status name with '/' replaced by ' '>``; then each ``remove_prefix`` value
  (same '/' replacement) is removed right after the last '/', followed by one ':' and leading blanks.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

MATCH_KEYS = ("startswith", "contains", "name", "expected", "regex", "find_and_remove_prefix")
LIST_ONLY_KEYS = ("startswith", "contains", "remove_prefix", "find_and_remove_prefix")  # as_string_array() in Jazzy
GENERIC = "diagnostic_aggregator/GenericAnalyzer"
GROUP = "diagnostic_aggregator/AnalyzerGroup"


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise TypeError(f"expected a string or a list of strings, got {value!r}")


@dataclass(frozen=True)
class Analyzer:
    """One GenericAnalyzer of the file, with the path it reports under (``/<group paths>/<path>``)."""

    key: str
    path: str
    params: dict

    def values(self, key: str) -> list[str]:
        return _strings(self.params[key]) if key in self.params else []

    def matches(self, status_name: str) -> bool:
        """GenericAnalyzer::match: would this analyzer take a status of that name."""
        if any(re.fullmatch(rx, status_name) for rx in self.values("regex")):
            return True
        if status_name in self.values("expected") or status_name in self.values("name"):
            return True
        starts = self.values("startswith") + self.values("find_and_remove_prefix")
        if any(status_name.startswith(s) for s in starts):
            return True
        return any(c in status_name for c in self.values("contains"))

    def output_name(self, status_name: str) -> str:
        """The name rqt_robot_monitor shows for that status (under /diagnostics_agg)."""
        name = f"{self.path}/{status_name.replace('/', ' ')}"
        for chaff in self.values("remove_prefix") + self.values("find_and_remove_prefix"):
            name = _remove_leading_name_chaff(name, chaff.replace("/", " "))
        return name


def _remove_leading_name_chaff(name: str, chaff: str) -> str:
    if not chaff:
        return name
    slash = name.rfind("/")
    head, tail = name[:slash + 1], name[slash + 1:]
    if tail.startswith(chaff):
        tail = tail[len(chaff):]
    if tail.startswith(":"):
        tail = tail[1:]
    return head + tail.lstrip(" ")


def load_analyzers(path: Path) -> tuple[dict, list[Analyzer]]:
    """The aggregator's top-level parameters and its GenericAnalyzers (groups flattened)."""
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict) and set(doc) == {"analyzers"}, \
        f"{path}: the aggregator's node is named `analyzers`; top-level keys {list(doc)}"
    params = doc["analyzers"]["ros__parameters"]
    base = "/" + params["path"] if params.get("path") else ""
    found: list[Analyzer] = []

    def walk(prefix: str, entries: dict) -> None:
        for key, value in entries.items():
            if not isinstance(value, dict):
                continue
            kind = value.get("type")
            assert kind in (GENERIC, GROUP), f"{key}: unsupported analyzer type {kind!r}"
            assert isinstance(value.get("path"), str) and value["path"], f"{key}: no path"
            here = f"{prefix}/{value['path']}"
            if kind == GROUP:
                walk(here, value.get("analyzers", {}))
            else:
                found.append(Analyzer(key, here, value))

    walk(base, params)
    return params, found


def check_jazzy_types(analyzer: Analyzer) -> list[str]:
    """Problems the Jazzy implementation would have with this analyzer's parameter types."""
    problems = []
    for key in LIST_ONLY_KEYS:
        if key in analyzer.params and not isinstance(analyzer.params[key], list):
            problems.append(f"{analyzer.key}.{key} must be a list of strings (as_string_array)")
    if not any(k in analyzer.params for k in MATCH_KEYS):
        problems.append(f"{analyzer.key}: no matching rule: the analyzer fails to initialise")
    return problems


def route(analyzers: Iterable[Analyzer], status_name: str) -> list[Analyzer]:
    """Every analyzer that takes the status (none: it goes to the aggregator's 'Other')."""
    return [a for a in analyzers if a.matches(status_name)]
