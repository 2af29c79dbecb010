"""What names an attachment in the line standing for it, where a model cannot read it (an image
in a chat tool message, a document a chat upstream has no part for). Full history compares those
lines (docs/behaviour.md#full-history-mode): one alike for any two attachments would let another
history's match, so a line names its attachment by URL or file id, else by a digest of the bytes
it carries.
"""

from __future__ import annotations

import hashlib

__all__ = ["digest"]


def digest(data: str) -> str:
    """A short digest of an attachment's bytes (as sent: base64 or a data URL) for its line."""
    return f"sha256 {hashlib.sha256(data.encode()).hexdigest()[:12]}"
