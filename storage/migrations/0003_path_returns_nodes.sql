-- 0003: bp_path now returns whole node rows (SETOF nodes) with its walk's plan pinned, and
-- bp_reachable gave way to bp_visible_foreign. A function's result type cannot be changed by
-- CREATE OR REPLACE, so the old definitions are dropped here; functions.sql recreates bp_path.
DROP FUNCTION IF EXISTS bp_path(uuid, uuid);
DROP FUNCTION IF EXISTS bp_reachable(uuid, text, text, uuid);
