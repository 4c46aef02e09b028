"""Reading policy and history files: the only I/O of the simulator's core.

Every error names the file as the user gave it (and the line, for history), so a
command line with several ``--policy`` files points at the one to fix.
"""

from __future__ import annotations

from pathlib import Path

from axengine.simulate._history import HistoryError, NodeRun, parse_history
from axengine.timeouts import Policy, PolicyError, parse_policy

__all__ = ["read_history_file", "read_policy_file"]


def _text(path: Path, error: type[PolicyError] | type[HistoryError], what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what} file") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from exc


def read_policy_file(path: str | Path) -> Policy:
    """The policy in a YAML file, named after the file's stem unless it has a ``name``.

    Raises:
        PolicyError: The file is missing or unreadable, or the policy is invalid.
    """
    path = Path(path)
    return parse_policy(_text(path, PolicyError, "policy"), str(path), name=path.stem)


def read_history_file(path: str | Path) -> list[NodeRun]:
    """The runs of a JSON Lines history file.

    Raises:
        HistoryError: The file is missing or unreadable, or a line is invalid
            (``file:line``).
    """
    path = Path(path)
    return parse_history(_text(path, HistoryError, "history").splitlines(), str(path))
