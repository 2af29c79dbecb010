"""Schemathesis against Branchpoint's own OpenAPI schema: generated requests (valid and not) to
every documented operation -- zero 5xx, and every response as the schema documents it.

(Driven through hypothesis directly: schemathesis' pytest plugin does not load under pytest 9.)
"""

import hypothesis.strategies as st
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

FUZZ_KEY = "sk-fuzz-tenant"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_api_conforms_to_its_schema(proxy, upstream):
    client = proxy.openai(FUZZ_KEY)
    for cid in ("fuzz-a", "fuzz-b"):  # some real data for generated requests to stumble upon
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                       extra_headers={"X-Conversation-Id": cid})
    schema = schemathesis.openapi.from_url(f"{proxy.url}/schema/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 14
    failures = []
    for operation in operations:

        # valid requests and deliberately invalid ones (wrong types, missing fields, bad ids)
        @given(case=st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE)))
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case):
            case.call_and_validate(base_url=proxy.url, headers={"Authorization": f"Bearer {FUZZ_KEY}"}, checks=CHECKS)

        try:
            check()
        except Exception as exc:  # collect every operation's failure, then report them all
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)
