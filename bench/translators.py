"""What the stream translators cost per delta: a chat upstream's stream of N text deltas (4
characters each) turned into a Responses client's events and into an Anthropic client's, in
process, CPU time of the translation alone (no network, no database) -- median of ``--rounds``.
Linear in N since 2026-12-05; before, each chunk joined the whole answer so far (20,000 deltas:
~1.7 s of CPU in either translator).

    uv run python bench/translators.py [--deltas 5000,20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import log, write_result

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from proxy.dialects.messages.stream import FromChat as MessagesFromChat
from proxy.dialects.responses.stream import FromChat as ResponsesFromChat


def _line(delta: dict) -> bytes:
    return b"data: " + json.dumps({"id": "x", "model": "m", "choices": [
        {"index": 0, "delta": delta, "finish_reason": None}]}).encode()


def _cpu_ms(make, lines: list[bytes]) -> float:
    translator = make()
    translator.opening()
    t0 = time.process_time()
    for line in lines:
        translator.event(line)
    return (time.process_time() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deltas", default="5000,20000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    makers = {"responses": lambda: ResponsesFromChat(node_id=uuid.uuid4(), params={"model": "m"}, instructions=None),
              "messages": lambda: MessagesFromChat(node_id=uuid.uuid4(), params={"model": "m"})}
    rows = []
    for n in (int(d) for d in args.deltas.split(",")):
        lines = [_line({"content": "abcd"}) for _ in range(n)]
        for name, make in makers.items():
            ms = statistics.median(_cpu_ms(make, lines) for _ in range(args.rounds))
            row = {"deltas": n, "client": name, "cpu_ms": round(ms, 1), "us_per_delta": round(ms * 1000 / n, 2)}
            log(str(row))
            rows.append(row)
    print(json.dumps(rows, indent=2))
    write_result({"translators": rows}, out=args.out)


if __name__ == "__main__":
    main()
