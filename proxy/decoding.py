"""Bounded content decoders: a body in gzip, deflate or zstd (``Content-Encoding``) undone at most
``_STEP`` bytes at a time and never past a limit (``UpstreamTooLarge`` beyond it) -- httpx's
decoders inflate a whole chunk at once: 16 KB of zstd became 512 MB. An upstream's answers are read
through them (``proxy.upstream``), and a stored call's compressed request body
(``proxy.routes.common.decoded_body``).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import httpx
import zstandard

from .errors import UpstreamTooLarge

__all__ = ["DECODED_CODINGS", "decoded_too_large", "decoder", "decoder_of"]

_STEP = 1 << 18  # the most a decoder inflates at once


def decoded_too_large(limit: int) -> UpstreamTooLarge:
    return UpstreamTooLarge(f"the upstream's answer is larger than {limit} bytes (server.max_response_bytes)")


_GZIP_MAGIC = b"\x1f\x8b"
_MEMBER_IN = 1 << 12  # after a gzip's first member, the most zlib is given at once
_MEMBER_COST = 1 << 12  # what each further member counts against the limit, however little it holds


class _Zlib:
    """gzip, or deflate (zlib-wrapped, else raw -- as httpx reads it), ``_STEP`` bytes at a time
    and ``limit`` in all (a stage inside another coding is bounded too). A gzip body may be several
    members one after another (RFC 1952: ``cat a.gz b.gz``, pigz): each is undone in turn, as
    Python's ``gzip`` and curl read them. What follows the end of the compressed data otherwise
    is ignored, as httpx does -- and never handed to zlib, which would keep it all
    (``unused_data``), copying it again with every chunk.

    At a member's end zlib copies what is left of its input (``unused_data``): members after the
    first are given it ``_MEMBER_IN`` bytes at a time, so a body of many tiny members costs a copy
    of a slice per member, not of the rest of the body (quadratic: 4 MiB of empty members took 18 s
    of the event loop); and each counts ``_MEMBER_COST`` against the limit, so their number is
    bounded by it too."""

    def __init__(self, coding: str, limit: int) -> None:
        self.gzip = coding != "deflate"
        self.raw_fallback = not self.gzip
        self.d = zlib.decompressobj(zlib.MAX_WBITS | 16 if self.gzip else zlib.MAX_WBITS)
        self.limit = limit
        self.total = 0
        self.members = 0  # (gzip: the members begun after the first)
        self.after = b""  # (gzip: the first byte of the magic that may begin the next member, at a chunk's end)
        self.ended = False  # (nothing more to undo: what comes is ignored)

    def _next_member(self, head: bytes) -> bool:
        """After a member's end, given the bytes that follow it (up to two): does a gzip member
        begin there? (A new decompressor is then made for it.) Not (yet): ignored from then on --
        or one byte of the magic kept for the next chunk."""
        if not self.gzip:
            self.ended = True
            return False
        if len(head) < len(_GZIP_MAGIC):
            if _GZIP_MAGIC.startswith(head):
                self.after = head
            else:
                self.ended = True
            return False
        if head != _GZIP_MAGIC:
            self.ended = True
            return False
        self.members += 1
        self.total += _MEMBER_COST
        if self.total > self.limit:
            raise decoded_too_large(self.limit)
        self.d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        return True

    def decode(self, data: bytes) -> Iterator[bytes]:
        if self.ended:
            return
        if self.after:
            data, self.after = self.after + data, b""
        view, pos = memoryview(data), 0
        try:
            while True:
                if self.d.eof and not self._next_member(bytes(view[pos:pos + len(_GZIP_MAGIC)])):
                    return
                piece = view[pos:pos + _MEMBER_IN] if self.members else view[pos:]
                try:
                    out = self.d.decompress(piece, _STEP)
                except zlib.error:
                    if not self.raw_fallback:
                        raise
                    self.d = zlib.decompressobj(-zlib.MAX_WBITS)
                    out = self.d.decompress(piece, _STEP)
                self.raw_fallback = False
                if out:
                    self.total += len(out)
                    if self.total > self.limit:
                        raise decoded_too_large(self.limit)
                    yield out
                # (what followed a member's end is in unused_data -- and may be in the tail too)
                pos += len(piece) - len(self.d.unused_data if self.d.eof else self.d.unconsumed_tail)
                if pos >= len(view) and len(out) < _STEP and not self.d.eof:  # (a full step may leave output inside zlib)
                    return
        except zlib.error as exc:
            raise httpx.DecodingError(str(exc)) from exc

    def flush(self) -> Iterator[bytes]:
        yield from self.decode(b"")


class _Zstd:
    """zstd through a stream writer whose sink refuses output past ``limit`` -- raising stops
    zstandard mid-input (its decompressobj has no bound on what one input inflates to). Windows
    above 8 MiB are refused, as RFC 9659 lets a decoder do for HTTP."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.out: list[bytes] = []
        self.writer = zstandard.ZstdDecompressor(max_window_size=1 << 23).stream_writer(
            self, write_size=_STEP, write_return_read=True, closefd=False)

    def write(self, data: bytes) -> int:  # the sink
        self.total += len(data)
        if self.total > self.limit:
            raise decoded_too_large(self.limit)
        self.out.append(bytes(data))
        return len(data)

    def decode(self, data: bytes) -> Iterator[bytes]:
        try:
            self.writer.write(data)
        except zstandard.ZstdError as exc:
            raise httpx.DecodingError(str(exc)) from exc
        out, self.out = self.out, []
        yield from out

    def flush(self) -> Iterator[bytes]:
        return iter(())


class _Chain:
    """Several codings, undone last first; every stage bounded the same way."""

    def __init__(self, stages: list[_Zlib | _Zstd]) -> None:
        self.stages = stages

    def decode(self, data: bytes) -> Iterator[bytes]:
        return self._through(0, self.stages[0].decode(data))

    def flush(self) -> Iterator[bytes]:
        return self._through(0, self.stages[0].flush())

    def _through(self, i: int, pieces: Iterator[bytes]) -> Iterator[bytes]:
        if i + 1 == len(self.stages):
            yield from pieces
            return
        stage = self.stages[i + 1]
        for piece in pieces:
            yield from self._through(i + 1, stage.decode(piece))
        yield from self._through(i + 1, stage.flush())


def decoder(headers: httpx.Headers, limit: int) -> _Zlib | _Zstd | _Chain | None:
    """The decoder of a response's ``Content-Encoding``; None when there is nothing to undo. An
    unknown coding is left as it came (as httpx does)."""
    value = headers.get("content-encoding")
    if not value:
        return None
    return decoder_of([c.strip().lower() for c in value.split(",")], limit)


def decoder_of(codings: list[str], limit: int) -> _Zlib | _Zstd | _Chain | None:
    """The decoder of a body in ``codings`` (as a Content-Encoding lists them, lower case: undone
    last first), each stage bounded by ``limit`` (``UpstreamTooLarge`` past it; a body that is not
    what its coding says, ``httpx.DecodingError``); None when none is one it knows
    (``DECODED_CODINGS``). Answers are read through it, and a stored call's request body."""
    stages: list[_Zlib | _Zstd] = []
    for coding in reversed(codings):
        if coding in ("gzip", "x-gzip", "deflate"):
            stages.append(_Zlib(coding, limit))
        elif coding == "zstd":
            stages.append(_Zstd(limit))
    if not stages:
        return None
    return stages[0] if len(stages) == 1 else _Chain(stages)


DECODED_CODINGS = frozenset({"gzip", "x-gzip", "deflate", "zstd"})
