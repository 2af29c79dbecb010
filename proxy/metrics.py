"""Prometheus metrics, one registry per app (several apps may live in one process: tests)."""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .tokens import cached_prompt, reported_prompt

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 1)


# The most tokens one call may add to ``branchpoint_tokens_total``: far above any context window
# (10 M), far below what would make the counter meaningless. An upstream's usage is whatever it
# sent: a negative count, a float, a string or 10**40 is not counted at all.
MAX_CALL_TOKENS = 1_000_000_000


def _count(value: Any) -> int:
    """A token count as the metrics take it: a non-negative integer up to ``MAX_CALL_TOKENS``
    (not a bool), else 0."""
    if type(value) is int and 0 <= value <= MAX_CALL_TOKENS:
        return value
    return 0


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("branchpoint_requests", "HTTP requests answered", ["route", "status"], registry=r)
        self.request_seconds = Histogram("branchpoint_request_seconds", "Whole request, first byte in to last byte out",
                                         ["route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.upstream_seconds = Histogram("branchpoint_upstream_seconds", "Time spent waiting on the upstream",
                                          ["route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.overhead_seconds = Histogram("branchpoint_overhead_seconds",
                                          "The proxy's own part of a request (whole minus upstream)",
                                          ["route"], buckets=_OVERHEAD_BUCKETS, registry=r)
        self.calls = Counter("branchpoint_calls", "Stored calls by kind and outcome", ["kind", "outcome"], registry=r)
        self.tokens = Counter("branchpoint_tokens", "Tokens reported by upstreams", ["direction"], registry=r)
        self.compactions = Counter("branchpoint_compactions", "Compactions by mode and result", ["mode", "result"], registry=r)
        self.cleared_results = Counter("branchpoint_cleared_tool_results",
                                       "Old tool results replaced by placeholders (context editing)", registry=r)
        self.cached_tokens = Counter("branchpoint_cached_tokens",
                                     "Prompt tokens upstreams reported served from their prompt caches", registry=r)
        self.pairing_drops = Counter("branchpoint_pairing_drops", "Items dropped by the pairing check", registry=r)
        self.busy_rejections = Counter("branchpoint_busy_rejections", "Turn calls refused with 409 conversation_busy", registry=r)
        self.bytes_in_flight = Gauge("branchpoint_request_bytes_in_flight",
                                     "Request body bytes held by this process's requests (server.max_bytes_in_flight)",
                                     registry=r)
        self.busy_bytes_rejections = Counter("branchpoint_bytes_in_flight_rejections",
                                             "Requests refused 503 server_busy: max_bytes_in_flight was reached",
                                             registry=r)
        self.inflight = Gauge("branchpoint_inflight_calls", "Calls of this process with a pending node", registry=r)
        self.pending_nodes = Gauge("branchpoint_pending_nodes", "Pending nodes in the database (all processes)", registry=r)
        self.reaped = Counter("branchpoint_reaped", "Pending nodes reaped as interrupted by this process", registry=r)
        self.pruned = Counter("branchpoint_pruned", "Conversations and nodes deleted by retention in this process",
                              ["what"], registry=r)
        ProcessCollector(registry=r)  # process_cpu_seconds_total, resident memory, open files ... (Linux)
        r.register(_SwitchCollector())
        # labelled children, looked up once (the label sets are few: routes, statuses, outcomes)
        self._per_request: dict[tuple[str, int], tuple[Any, Any, Any, Any]] = {}
        self._per_call: dict[tuple[str, str], Any] = {}
        self._tokens_in, self._tokens_out = self.tokens.labels("in"), self.tokens.labels("out")

    def observe_request(self, route: str, status: int, seconds: float, upstream_seconds: float) -> None:
        """One answered request. The labelled children are kept per route (and status): looked up
        through ``labels()`` seven times a stored call, they showed as ~2 % of the proxy's CPU in
        a profile (an A/B of the whole proxy: −1 %, within its noise)."""
        key = (route, status)
        children = self._per_request.get(key)
        if children is None:
            children = self._per_request[key] = (
                self.requests.labels(route, str(status)), self.request_seconds.labels(route),
                self.upstream_seconds.labels(route), self.overhead_seconds.labels(route))
        requests, whole, upstream, overhead = children
        requests.inc()
        whole.observe(seconds)
        if upstream_seconds:
            upstream.observe(upstream_seconds)
            overhead.observe(max(0.0, seconds - upstream_seconds))

    def watch_database(self, db: Any) -> None:
        """Export the pool's statement count: database round trips, to compare with calls."""
        self.registry.register(_StatementCollector(db))

    def observe_call(self, kind: str, outcome: str, usage: dict[str, Any] | None) -> None:
        calls = self._per_call.get((kind, outcome))
        if calls is None:
            calls = self._per_call[(kind, outcome)] = self.calls.labels(kind, outcome)
        calls.inc()
        self.observe_tokens(usage)

    def observe_tokens(self, usage: dict[str, Any] | None) -> None:
        """The tokens an upstream reported for a call: a client's, or the summariser's."""
        if isinstance(usage, dict) and usage:
            prompt = _count(reported_prompt(usage))
            completion = _count(usage.get("completion_tokens", usage.get("output_tokens")))
            if prompt:
                self._tokens_in.inc(prompt)
            if completion:
                self._tokens_out.inc(completion)
            cached = _count(cached_prompt(usage))
            if cached:
                self.cached_tokens.inc(cached)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SwitchCollector(Collector):
    """Context switches of this process's threads (Linux). Involuntary ones per stored call show
    the proxy losing its core to a process it woke -- a database on the same cores
    (docs/scaling.md#the-embedded-database)."""

    def collect(self) -> Any:
        counts = {"voluntary": 0, "involuntary": 0}
        try:
            threads = os.listdir("/proc/self/task")
        except OSError:
            return
        for tid in threads:
            try:
                with open(f"/proc/self/task/{tid}/status", "rb") as f:
                    status = f.read()
            except OSError:  # a thread that ended meanwhile
                continue
            for line in status.splitlines():
                if line.startswith(b"voluntary_ctxt_switches:"):
                    counts["voluntary"] += int(line.split()[1])
                elif line.startswith(b"nonvoluntary_ctxt_switches:"):
                    counts["involuntary"] += int(line.split()[1])
        family = CounterMetricFamily("branchpoint_process_context_switches", "Context switches of this process's threads",
                                     labels=["kind"])
        for kind, count in counts.items():
            family.add_metric([kind], count)
        yield family


class _StatementCollector(Collector):
    def __init__(self, db: Any) -> None:
        self.db = db

    def collect(self) -> Any:
        family = CounterMetricFamily("branchpoint_db_statements", "Database statements (round trips) sent by this process")
        family.add_metric([], self.db.statements)
        yield family
        yield CounterMetricFamily("branchpoint_db_batches", "Round trips that carried the statements of several calls",
                                  value=self.db.batches)
        yield CounterMetricFamily("branchpoint_db_batched_statements", "Statements sent in those round trips",
                                  value=self.db.batched)
        state = self.db.pool_state()
        if state is not None:
            idle, lent, waiting = state
            connections = GaugeMetricFamily("branchpoint_db_connections", "Database connections of this process's pool",
                                            labels=["state"])
            connections.add_metric(["idle"], idle)
            connections.add_metric(["lent"], lent)
            yield connections
            yield GaugeMetricFamily("branchpoint_db_waiting", "Callers waiting for a database connection", value=waiting)
