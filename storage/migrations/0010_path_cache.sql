-- 0010: the call's path read stops at nodes the proxy already has.
--
-- Why: a finished node never changes, so a proxy process keeps the finished part of recently used
-- paths in memory and asks the database only for the nodes below it (docs/architecture.md#the-path-cache).
-- bp_begin_call / bp_begin_full / bp_path_nodes gain a `p_known` argument; the old signatures go,
-- so a named-argument call can never pick the wrong overload.

DROP FUNCTION IF EXISTS bp_path_nodes(uuid, uuid);
DROP FUNCTION IF EXISTS bp_begin_call(text, text, text, uuid, uuid, text, text, text, uuid, jsonb, bytea[], bytea[], integer, bytea, double precision, text, text, jsonb, integer[], text);
DROP FUNCTION IF EXISTS bp_begin_full(text, text, text, uuid, uuid, text, jsonb, bytea[], integer, bytea, double precision, text, text, jsonb, integer[], text);
