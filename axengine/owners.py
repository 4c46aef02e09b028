"""Owner ids of workers and API processes, and telling whether one's process is gone.

An owner id is ``prefix:host:pid:rand``. It names the lease holder of a RUNNING node,
the holder of a queue processing list and the reconciler leader. Naming the host and
the process lets an embedded run that resumes on the same machine see that the previous
owner died (its pid no longer exists) and void its lease at once instead of waiting it
out; an owner on another host is never judged dead from here.
"""

from __future__ import annotations

import os
import secrets

__all__ = ["LOCAL_PRINCIPAL", "host_pid_owner", "owner_is_dead"]

#: ``submitted_by`` of tasks submitted through the embedded engine (``ax run``, the SDK):
#: there is no authenticated principal, only the local user.
LOCAL_PRINCIPAL = "local"


def host_pid_owner(prefix: str = "w") -> str:
    """A worker id that names its host and process, so a resumed embedded run can tell
    whether the previous owner is still alive."""
    return f"{prefix}:{os.uname().nodename}:{os.getpid()}:{secrets.token_hex(3)}"


def owner_is_dead(owner: str) -> bool:
    """True when ``owner`` (``prefix:host:pid:rand``) names a process on this host that
    no longer exists — its lease need not be waited out."""
    parts = owner.split(":")
    if len(parts) != 4 or parts[1] != os.uname().nodename:
        return False
    try:
        pid = int(parts[2])
    except ValueError:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
