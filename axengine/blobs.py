"""Content-addressed blob store for payloads too large for the state store.

The store holds control state only: outputs and rendered inputs above
``DEFAULT_THRESHOLD`` bytes are written here first (idempotently: the name is the
sha256 of the content) and the snapshot keeps ``BlobRef(uri, sha256, size)``. Reads
verify the sha256, so a truncated or tampered blob is an error, never silent data.

An orphan blob (written, then the transaction lost its compare) is harmless: it is
content-addressed and unreferenced.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Protocol

from axengine.errors import BlobError
from axengine.records import BlobRef

__all__ = ["DEFAULT_THRESHOLD", "BlobStore", "DirBlobStore"]

#: Payloads larger than this many bytes (JSON-encoded) go to the blob store.
DEFAULT_THRESHOLD = 64 * 1024


class BlobStore(Protocol):
    """Put and get immutable content by sha256."""

    def put(self, data: bytes) -> BlobRef:
        """Store ``data`` (idempotent) and return its reference."""
        ...

    def get(self, ref: BlobRef) -> bytes:
        """Return the content of ``ref``, verified against its sha256."""
        ...


class DirBlobStore:
    """Blobs as files ``<root>/<sha[:2]>/<sha>`` (the embedded default)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, sha: str) -> Path:
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

    def get(self, ref: BlobRef) -> bytes:
        path = self._path(ref.sha256)
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise BlobError(f"blob {ref.sha256} not found at {path}") from exc
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise BlobError(f"blob {ref.sha256} at {path} does not match its sha256")
        return data
