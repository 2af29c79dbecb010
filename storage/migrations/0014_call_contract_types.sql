-- 0014: the call contracts are read into composite types (bp_call_start_t, bp_call_finish_t in
-- storage/functions/calls.sql) by jsonb_populate_record, bytes travelling as hex strings.
--
-- Why: reading the jsonb field by field in PL/pgSQL (bp_call_start) and decoding base64 digest
-- lists (bp_bytes) cost ~0.3 ms of PostgreSQL CPU per begin + finish pair (bench/pg_calls.py);
-- one C-level call per contract does the same work. The two functions go.

DROP FUNCTION IF EXISTS bp_call_start(jsonb);
DROP FUNCTION IF EXISTS bp_bytes(jsonb);
