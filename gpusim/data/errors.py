"""The error raised for unusable scenario input."""

from __future__ import annotations


class ScenarioError(ValueError):
    """A scenario file (or a conversion request) cannot be used.

    The message always starts with the file and names the offending field, e.g.
    ``"scene.json.xz: objects[3].heading: 90 entries, expected 91"``.

    Attributes:
        file: the path of the offending file (``str``), or ``""`` when no single file is at fault.
        field: the JSON field at fault in JSONPath-like notation (``"objects[3].valid"``), or ``""``.
        reason: what is wrong with it (the message without file and field).
    """

    def __init__(self, file, field: str, reason: str):
        self.file = str(file) if file is not None else ""
        self.field = field or ""
        self.reason = reason
        parts = [p for p in (self.file, self.field) if p]
        super().__init__(": ".join(parts + [reason]))

    def __reduce__(self):  # keep picklable with the three-argument constructor
        return (type(self), (self.file, self.field, self.reason))


class NoControllableAgentError(ScenarioError):
    """A well-formed scenario without any agent that passes the control rule: it is skipped
    (with a warning, and counted) by batch conversion rather than reported as an error."""


class PackFileError(ScenarioError):
    """A saved scenario pack cannot be used: empty, truncated, not a pack, random bytes, another
    format version or inconsistent tensors. ``file`` is the pack file; the message is one line
    ending with what to do (convert the data again)."""
