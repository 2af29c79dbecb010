"""The Responses API on the tree (docs/behaviour.md#the-responses-api).

    items.py      Responses items <-> chat messages; response ids <-> node ids; an upstream's response read
    translate.py  a Responses request for a chat upstream, and the response objects we serve
    stream.py     Responses event streams: translated from a chat stream, or relayed natively
    for_chat.py   chat-completions clients over a Responses upstream: request, answer, stream
"""
