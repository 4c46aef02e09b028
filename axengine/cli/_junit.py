"""JUnit XML for CI test reports (``ax validate --format junit``, ``ax test --format junit``).

The schema CI servers read (GitHub Actions reporters, GitLab, Jenkins): one
``<testsuite>`` of ``<testcase>`` elements, a failed case holding a ``<failure>`` with a
one-line ``message`` and the full text.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Case", "junit_xml"]


@dataclass(frozen=True)
class Case:
    """One test case.

    Attributes:
        name: What was checked (a file).
        classname: The group it belongs to (``ax.validate``).
        failure: ``(message, type, text)`` of its failure (one line, a class such as
            ``unknown-target``, the full text); None: it passed.
        file: The file it is about, for reporters that link to it.
        seconds: How long it took.
    """

    name: str
    classname: str
    failure: tuple[str, str, str] | None = None
    file: str = ""
    seconds: float = 0.0


def junit_xml(suite: str, cases: Sequence[Case]) -> str:
    """The JUnit XML document of ``cases`` in one suite named ``suite``."""
    failed = sum(1 for c in cases if c.failure is not None)
    root = ET.Element("testsuites", name=suite, tests=str(len(cases)),
                      failures=str(failed), errors="0")
    element = ET.SubElement(root, "testsuite", name=suite, tests=str(len(cases)),
                            failures=str(failed), errors="0", skipped="0",
                            time=f"{sum(c.seconds for c in cases):.3f}")
    for case in cases:
        attrs = {"classname": case.classname, "name": case.name, "time": f"{case.seconds:.3f}"}
        if case.file:
            attrs["file"] = case.file
        tc = ET.SubElement(element, "testcase", attrs)
        if case.failure is not None:
            message, kind, text = case.failure
            failure = ET.SubElement(tc, "failure", message=message, type=kind)
            failure.text = text
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode")
