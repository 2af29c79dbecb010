"""The Conversations API and the compaction controls through the official openai Node package
(tests/node/conversations.mjs), asserted on what the fake upstream received."""

import pytest

from proxy.compaction import SUMMARY_PREFIX

from .test_node_sdk import _run_node


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_the_node_sdk_drives_the_conversations_api(proxy, upstream, key):
    seen = _run_node("conversations.mjs", {"BASE_URL": proxy.url, "API_KEY": key})
    assert seen["conversation"]["id"].startswith("conv_") and seen["conversation"]["metadata"] == {"sdk": "node"}
    assert seen["answer"] == "echo: node question"
    assert seen["listed"] == ["node item one", "node item two", "node question", "echo: node question"]
    assert seen["after"] == ["node item one", "node question", "echo: node question"]
    assert seen["afterIds"] == [seen["ids"][0], *seen["ids"][2:]]  # stable ids; the item left out
    assert seen["compacted"]["types"] == ["compaction", "message"]
    assert seen["compacted"]["summary"].startswith(SUMMARY_PREFIX)
    assert seen["now"] == {"object": "response.compaction", "types": ["compaction", "message", "message", "message",
                                                                      "message", "message", "message"]}
    # what the upstream received: the conversation's items, then the question ...
    first = next(r for r in upstream.turn_requests if r.messages[-1]["content"] == "node question")
    assert [m["content"] for m in first.messages] == ["node item one", "node item two", "node question"]
    # ... and, compacted, the summary first -- and never the fields the proxy applies itself
    compacted = next(r for r in upstream.turn_requests if r.messages[-1]["content"] == "after the facts")
    assert compacted.messages[0]["content"].startswith(SUMMARY_PREFIX)
    assert "context_management" not in compacted.body and "truncation" not in compacted.body
