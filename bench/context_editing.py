#!/usr/bin/env python3
"""A 100-turn coding-agent session with large tool outputs, four ways: what context editing
(docs/behaviour.md#context-editing) and summarising each do to what the model is sent.

    uv run python bench/context_editing.py [--turns 100] [--seed 42]

The session is what Codex or Claude Code sends in a tool loop: a system prompt of ~2,000 tokens
and a task, then one tool result per call -- file reads (code), shell output (log lines), search
hits -- of 0.5 to 40 KB, and now and then the user steering. A fake LLM (in this process, on
127.0.0.1) answers each call with the next tool call, counts the prompt tokens of what it received
with the same offline tiktoken encoding the proxy uses, refuses a request above the model's input
limit as a context overflow, and answers Branchpoint's summariser with ~1,500 tokens. The model:
a 200,000-token window with 32,000 reserved for output (input limit 168,000).

Branchpoint (its own process, embedded PostgreSQL) runs it four times, each in a new data folder:

    nothing   no clearing, summaries off (soft = hard = 1.0: only a request that would not fit)
    clearing  [context_editing] defaults (0.5 / keep 3 / at least 0.1), summaries off as above
    summary   no clearing, [compaction] defaults (soft 0.7, hard 0.9)
    both      the defaults: clearing, then summarising above its thresholds

Reported for each: upstream input tokens per call and in total, the largest request against the
limit, calls above the soft threshold, the share of calls whose request is a byte-for-byte
extension of the one before (a provider's prompt cache reads all of the previous request), the
tokens a prompt cache could serve (each request's longest common prefix with the one before) and
what is left, summariser calls, clearings and summaries. The goal (issue 32): clearing alone keeps
every call under the soft threshold with >= 90 % of calls prefix-stable and no summariser call.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import threading
from pathlib import Path

import httpx
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _harness import KEY, Procs, arguments, asgi_body, log, serve_in_thread, start_branchpoint, write_result

from proxy.tokens import TokenCounter
from tests.helpers import prefix_extends

MODEL = "bench-agent"
WINDOW, RESERVED = 200_000, 32_000
LIMIT = WINDOW - RESERVED
CONFIGS = {
    "nothing": '[context_editing]\nclear_tool_results = 0\n[compaction]\nsoft = 1.0\nhard = 1.0\n',
    "clearing": '[compaction]\nsoft = 1.0\nhard = 1.0\n',
    "summary": '[context_editing]\nclear_tool_results = 0\n',
    "both": "",
}
SYSTEM = ("You are a coding agent working in a repository. Use the tools to read files, run commands and "
          "search; make small, tested changes; report what you did. ") * 60  # ~2,000 tokens
TOOLS = ("read_file", "shell", "grep")


def tool_output(rng: random.Random, turn: int, tool: str) -> str:
    """What a tool returned: code for a file read, log lines for a shell command, hits for a search."""
    if tool == "read_file":
        lines = rng.randint(80, 900)
        return "\n".join(f"    def handler_{turn}_{j}(self, request, retries={j % 5}):  # "
                         f"{rng.choice(['parse', 'validate', 'store', 'retry', 'log'])} step {j}" for j in range(lines))
    if tool == "shell":
        lines = rng.randint(20, 250)
        return "\n".join(f"2026-12-02T10:{j % 60:02d}:{(j * 7) % 60:02d}Z INFO worker-{rng.randint(1, 8)} "
                         f"job={rng.randint(1000, 9999)} status={rng.choice(['ok', 'ok', 'ok', 'retry'])} "
                         f"took={rng.randint(3, 900)}ms" for j in range(lines))
    lines = rng.randint(5, 60)
    return "\n".join(f"src/module_{rng.randint(1, 40)}.py:{rng.randint(1, 900)}: "
                     f"handler_{turn}_{j} = Handler(queue='jobs', timeout={rng.randint(1, 60)})" for j in range(lines))


class FakeLLM:
    """ASGI app: chat completions answering with the next tool call, prompt tokens counted as a
    tokeniser counts them; requests above the input limit refused as a context overflow."""

    def __init__(self, counter: TokenCounter, seed: int) -> None:
        self.counter = counter
        self.rng = random.Random(seed)
        self.calls: list[dict] = []  # per turn call: tokens, cached, prefix-extends, raw
        self.summaries = 0
        self.previous: bytes | None = None
        self.previous_messages: list[bytes] = []
        self.lock = threading.Lock()

    def reset(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.calls, self.summaries, self.previous, self.previous_messages = [], 0, None, []

    def _cached(self, raw: bytes, prompt: int) -> tuple[int, bool]:
        """(tokens of the longest common message prefix with the previous request, whether this
        request extends it byte for byte) -- what a provider's prompt cache could serve."""
        body = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
        messages = [bytes(m) for m in msgspec.json.decode(bytes(body["messages"]), type=list[msgspec.Raw])]
        extends = self.previous is not None and prefix_extends(self.previous, raw)
        same = 0
        for a, b in zip(self.previous_messages, messages, strict=False):
            if a != b:
                break
            same += 1
        cached = self.counter.messages([json.loads(m) for m in messages[:same]]) if same else 0
        self.previous, self.previous_messages = raw, messages
        return min(cached, prompt), extends

    async def __call__(self, scope, receive, send) -> None:
        raw = await asgi_body(scope, receive, send)
        if raw is None:
            return
        if scope["method"] != "POST":
            await self._send(send, 200, {"ok": True})
            return
        request = json.loads(raw)
        messages = request.get("messages", [])
        prompt = self.counter.messages(messages) + 3
        if messages and str(messages[0].get("content", "")).startswith("You compress"):
            with self.lock:
                self.summaries += 1
            content = ("Summary: the agent read the handlers of the job queue, ran the worker tests, found retries "
                       "misconfigured and is fixing the timeout handling; open: rerun the suite. ") * 50
            await self._answer(send, request, {"role": "assistant", "content": content}, prompt)
            return
        if prompt > LIMIT:
            await self._send(send, 400, {"error": {"message": f"This model's maximum context length is {WINDOW} tokens. "
                                                   f"However, your messages resulted in {prompt} tokens.",
                                                   "type": "invalid_request_error", "param": "messages",
                                                   "code": "context_length_exceeded"}})
            with self.lock:
                self.calls.append({"tokens": prompt, "overflow": True})
            return
        with self.lock:
            cached, extends = self._cached(raw, prompt)
            n = len(self.calls)
            self.calls.append({"tokens": prompt, "cached": cached, "extends": extends})
            tool = TOOLS[self.rng.randrange(3)] if n % 7 else "read_file"
        call = {"id": f"call_{n}", "type": "function",
                "function": {"name": tool, "arguments": json.dumps({"path": f"src/module_{n % 40}.py", "turn": n})}}
        await self._answer(send, request, {"role": "assistant", "content": f"Step {n}: checking with {tool}.",
                                           "tool_calls": [call]}, prompt)

    async def _answer(self, send, request: dict, message: dict, prompt: int) -> None:
        completion = self.counter.text(message.get("content") or "") + 20
        await self._send(send, 200, {
            "id": "chatcmpl-bench", "object": "chat.completion", "model": request.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})

    @staticmethod
    async def _send(send, status: int, data: dict) -> None:
        body = json.dumps(data).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def run(name: str, config: str, fake: FakeLLM, args, up_port: int) -> dict:
    """One session through a new Branchpoint with ``config``; the figures of what the fake received."""
    fake.reset(args.seed)
    rng = random.Random(args.seed + 1)
    work = Path(tempfile.mkdtemp(prefix=f"bp-context-editing-{name}-"))
    procs = Procs()
    try:
        proxy, _ = start_branchpoint(procs, work, port=args.port, upstream_url=f"http://127.0.0.1:{up_port}/v1",
                                     config=f'[models."{MODEL}*"]\ncontext_window = {WINDOW}\n'
                                            f"max_output_tokens = {RESERVED}\n" + config)
        overflowed_at = None
        with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {KEY}", "X-Conversation-Id": "agent"},
                          timeout=120) as http:
            messages: list[dict] = [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": "Fix the retry handling of the job workers."}]
            for turn in range(args.turns):
                r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
                if r.status_code != 200:
                    overflowed_at = turn
                    log(f"{name}: turn {turn} answered {r.status_code}: {r.text[:120]}")
                    break
                call = r.json()["choices"][0]["message"]["tool_calls"][0]
                tool = call["function"]["name"]
                messages = [{"role": "tool", "tool_call_id": call["id"], "content": tool_output(rng, turn, tool)}]
                if turn % 25 == 24:
                    messages.append({"role": "user", "content": f"Also make sure the change {turn // 25} keeps the logs."})
            metrics = http.get("/metrics").text
            nodes = http.get("/admin/conversations/agent/tree").json()["data"]
    finally:
        procs.stop()
    turns = [c for c in fake.calls if not c.get("overflow")]
    tokens = [c["tokens"] for c in turns]
    cached = sum(c["cached"] for c in turns)
    stable = sum(c["extends"] for c in turns[1:])
    cleared = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("branchpoint_cleared_tool_results_total "))
    return {
        "calls": len(turns), "overflowed_at_turn": overflowed_at,
        "input_tokens_total": sum(tokens), "input_tokens_max": max(tokens),
        "max_share_of_limit": round(max(tokens) / LIMIT, 3),
        "calls_above_soft": sum(t > 0.7 * LIMIT for t in tokens),
        "prefix_stable_share": round(stable / max(1, len(turns) - 1), 3),
        "cacheable_tokens_total": cached, "uncached_tokens_total": sum(tokens) - cached,
        "summariser_calls": fake.summaries,
        "clearings": sum(1 for n in nodes if n.get("method") == "clear_tool_results"),
        "summaries": sum(1 for n in nodes if n.get("method") == "summary"),
        "tool_results_cleared": int(cleared),
        "p50_input_tokens": statistics.median(tokens),
        "input_tokens_per_call": tokens,
    }


def main() -> None:
    ap = arguments(__doc__, port=14020, up_port=14021)
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--only", choices=list(CONFIGS), action="append", help="run only these (repeatable)")
    ap.add_argument("--context-editing", default="", metavar="TOML",
                    help='more [context_editing] keys for "clearing" and "both", e.g. "clear_tool_results = 0.6"')
    args = ap.parse_args()
    if args.context_editing:
        for name in ("clearing", "both"):
            CONFIGS[name] += "[context_editing]\n" + args.context_editing.replace(";", "\n") + "\n"
    counter = TokenCounter()
    counter.load()
    fake = FakeLLM(counter, args.seed)
    server = serve_in_thread(fake, args.up_port)
    results = {}
    try:
        for name, config in CONFIGS.items():
            if args.only and name not in args.only:
                continue
            results[name] = run(name, config, fake, args, args.up_port)
            printable = {k: v for k, v in results[name].items() if k != "input_tokens_per_call"}
            log(f"{name}: {json.dumps(printable)}")
    finally:
        server.should_exit = True
    header = ("config", "calls", "overflow", "input total", "max/limit", "> soft", "prefix-stable", "cacheable",
              "uncached", "summariser", "clearings", "summaries")
    print(" | ".join(header))
    for name, r in results.items():
        print(" | ".join(str(x) for x in (name, r["calls"], r["overflowed_at_turn"], f"{r['input_tokens_total']:,}",
                                          r["max_share_of_limit"], r["calls_above_soft"], r["prefix_stable_share"],
                                          f"{r['cacheable_tokens_total']:,}", f"{r['uncached_tokens_total']:,}",
                                          r["summariser_calls"], r["clearings"], r["summaries"])))
    write_result({"turns": args.turns, "seed": args.seed, "input_limit": LIMIT, "results": results}, out=args.out)


if __name__ == "__main__":
    main()
