-- 0024: the transcript index holds only the nodes a full-history call may hang under.
--
-- Why: every lookup by `chain` leaves transforms out (bp_match_rows, the /auto/v1 probe, the
-- session continuation's probe) -- a side call is never a parent. But a transform's chain is its
-- whole transcript's, so the side calls an app repeats on one history (a title, a guardrail, a
-- summary of the same messages) all share one chain, and every full-history call's first probe --
-- its whole history, the same as theirs -- read each of them from the heap to filter it away:
-- ~1 microsecond per side call ever made, 0.3 ms a call once there were 600 (docs/behaviour.md#full-history-mode).
-- Partial on `kind <> 'transform'`, which each of those lookups says: they read the same index,
-- without the side calls. (The name stays: tests/test_tree_keys.py drops it by name.)
--
-- On a big table this rebuilds the index, and writes wait meanwhile: run `branchpoint migrate`
-- before rolling out (README).
DROP INDEX nodes_by_chain;
CREATE INDEX nodes_by_chain ON nodes (chain, tenant, tree_id) WHERE kind <> 'transform';
