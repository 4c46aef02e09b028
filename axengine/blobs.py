"""Content-addressed blob store for payloads too large for the state store.

The store holds control state only: outputs and rendered inputs above
``DEFAULT_THRESHOLD`` bytes are written here first (idempotently: the name is the
sha256 of the content) and the snapshot keeps ``BlobRef(uri, sha256, size)``. Reads
verify the sha256, so a truncated or tampered blob is an error, never silent data.

An orphan blob (written, then the transaction lost its compare) is harmless: it is
content-addressed and unreferenced.

A reference can come from outside (an executor's ``Complete`` with an ``output_ref``),
so reading one is hardened: only a 64-lowercase-hex digest is accepted (anything else
is an :class:`~axengine.errors.InputError` before any filesystem call) and the path is
derived from the digest alone (the ``uri`` is never opened); the file is opened with
``O_NOFOLLOW | O_NONBLOCK`` (a symlink or a FIFO planted in the directory cannot redirect
or block the reader), must be a regular file per ``fstat``, and is read only up to
``max_bytes`` (and the size the reference declares). The calls are blocking: the engine
runs them in a worker thread.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Protocol

from axengine.errors import BlobError, InputError
from axengine.records import BlobRef

__all__ = ["DEFAULT_MAX_BLOB_BYTES", "DEFAULT_THRESHOLD", "BlobStore", "DirBlobStore",
           "check_digest"]

#: Payloads larger than this many bytes (JSON-encoded) go to the blob store.
DEFAULT_THRESHOLD = 64 * 1024
#: Largest blob a read accepts: a reader never loads more than this into memory, whatever
#: the file or the reference claims. Outputs travel to the API inside one gRPC message
#: first, so this is far above what a node can legitimately produce there.
DEFAULT_MAX_BLOB_BYTES = 256 * 1024 * 1024

_DIGEST = re.compile(r"[0-9a-f]{64}")


def check_digest(sha: str) -> str:
    """Return ``sha`` if it is a sha256 hex digest (64 lowercase hex digits).

    Raises:
        InputError: Anything else (a path, ``..``, upper case, the wrong length).
    """
    if not isinstance(sha, str) or _DIGEST.fullmatch(sha) is None:
        shown = sha[:80] if isinstance(sha, str) else type(sha).__name__
        raise InputError(f"blob reference {shown!r} is not a sha256 digest (64 lowercase "
                         "hex digits)")
    return sha


class BlobStore(Protocol):
    """Put and get immutable content by sha256."""

    def put(self, data: bytes) -> BlobRef:
        """Store ``data`` (idempotent) and return its reference."""
        ...

    def get(self, ref: BlobRef, *, max_bytes: int | None = None) -> bytes:
        """Return the content of ``ref``, verified against its sha256, refusing blobs
        larger than ``max_bytes`` (None: the store's own maximum)."""
        ...


class DirBlobStore:
    """Blobs as files ``<root>/<sha[:2]>/<sha>`` (the embedded default).

    Args:
        root: The blob directory.
        max_bytes: Largest blob :meth:`get` reads.
    """

    def __init__(self, root: str | os.PathLike[str], *,
                 max_bytes: int = DEFAULT_MAX_BLOB_BYTES) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes

    def _path(self, sha: str) -> Path:
        # The digest alone names the file: a "sha" like "/etc/shadow" or "../x" never
        # reaches the filesystem (an absolute part would replace the root in a join).
        sha = check_digest(sha)
        return self.root / sha[:2] / sha

    def put(self, data: bytes) -> BlobRef:
        sha = hashlib.sha256(data).hexdigest()
        path = self._path(sha)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            # Write-then-rename so a crash never leaves a partial blob under its final name.
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return BlobRef(uri=f"file://{path.resolve()}", sha256=sha, size=len(data))

    def get(self, ref: BlobRef, *, max_bytes: int | None = None) -> bytes:
        """Read and verify a blob.

        Raises:
            InputError: ``ref.sha256`` is not a digest, or ``ref.size`` is above the
                limit.
            BlobError: Missing, not a regular file, larger than the limit or than
                ``ref.size`` says, or its content does not match its sha256.
        """
        limit = self.max_bytes if max_bytes is None else min(max_bytes, self.max_bytes)
        path = self._path(ref.sha256)
        if ref.size > limit:
            raise InputError(f"blob {ref.sha256} declares {ref.size} bytes; the limit is "
                             f"{limit}")
        if ref.size:
            limit = ref.size
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise BlobError(f"blob {ref.sha256} not found") from exc
        except OSError as exc:
            raise BlobError(f"blob {ref.sha256} cannot be opened: {exc.strerror}") from exc
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fh.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise BlobError(f"blob {ref.sha256} is not a regular file")
            if info.st_size > limit:
                raise BlobError(f"blob {ref.sha256} is {info.st_size} bytes; at most "
                                f"{limit} are read")
            data = fh.read(limit + 1)
        if len(data) > limit:  # grew after fstat
            raise BlobError(f"blob {ref.sha256} is larger than {limit} bytes")
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise BlobError(f"blob {ref.sha256} does not match its sha256")
        return data
