#!/usr/bin/env python3
"""Token estimates of giant texts (proxy/tokens.py): the time and the memory one estimate costs,
sampled (what the proxy does above ``EXACT_CHARS``) against tokenising the whole text, and how far
apart the two counts are. Each measurement runs in a child process of its own, so its peak RSS
is its own.

    uv run python bench/tokens.py [--sizes 1,4,30] [--exact-up-to 4]

Texts: prose-like words, and a run of one letter (one pre-token: tiktoken merges it pair by pair,
its worst case). ``--exact-up-to``: the largest size (MB) also tokenised whole (slow for the run).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _harness import arguments, log, write_result

_CHILD = r"""
import json, random, resource, sys, time
from proxy.tokens import TokenCounter
kind, size, whole = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
if kind == "run":
    text = "b" * size
else:
    r = random.Random(1)
    vocab = ["sales", "region", "north", "grew", "by", "12.5%", "customer", "Hanbit", "order", "the", "of", "42"]
    text = " ".join(r.choice(vocab) for _ in range(size // 5))[:size]
counter = TokenCounter()
counter.load()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
n = len(counter._encoding.encode_ordinary(text)) if whole else counter.text(text)
seconds = time.perf_counter() - t0
print(json.dumps({"tokens": n, "seconds": seconds,
                  "peak_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024}))
"""


def measure(kind: str, size: int, whole: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, kind, str(size), "1" if whole else "0"],
                         capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--sizes", default="1,4,30", help="text sizes in MB")
    ap.add_argument("--exact-up-to", type=float, default=4, help="tokenise whole up to this size (MB)")
    args = ap.parse_args()
    rows = []
    for kind in ("words", "run"):
        for mb in (float(x) for x in args.sizes.split(",")):
            size = int(mb * (1 << 20))
            sampled = measure(kind, size, False)
            row = {"text": kind, "mb": mb, "sampled_ms": round(sampled["seconds"] * 1000, 1),
                   "sampled_peak_mb": round(sampled["peak_mb"], 1), "sampled_tokens": sampled["tokens"]}
            if mb <= args.exact_up_to:
                whole = measure(kind, size, True)
                row.update(whole_ms=round(whole["seconds"] * 1000, 1), whole_peak_mb=round(whole["peak_mb"], 1),
                           whole_tokens=whole["tokens"],
                           error_pct=round(100 * (sampled["tokens"] - whole["tokens"]) / whole["tokens"], 2))
            log(json.dumps(row))
            rows.append(row)
    print(json.dumps(rows, indent=2))
    write_result({"estimates": rows}, out=args.out)


if __name__ == "__main__":
    main()
