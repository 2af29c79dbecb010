-- 0026: the nodes a deleted conversation left for its forks are no conversation's own.
--
-- Why: a delete keeps the nodes a fork still reaches, and they kept the deleted conversation's
-- id. A new conversation of that id made in that tree -- a fork of the fork, or a session
-- continuing it -- then took them for its own: it counted them and their usage, listed them in
-- its tree and its search hits, could move its head onto one (and send a deleted question
-- upstream), and its delete kept them. bp_delete_conversation (storage/functions/moves.sql) now
-- relabels what it keeps '<id> (deleted)', which no conversation id can be (a space); this does
-- the same for what earlier deletes kept: the nodes whose conversation is gone (the same test as
-- migration 0015's). Then the nodes a fork made under a deleted conversation's name took over
-- are given back: a fork's own nodes are all younger than the fork, so a node older than the
-- fork whose name it carries was the deleted conversation's (a fork made into an empty
-- conversation keeps that one's creation time, older still than its own nodes). Older by more
-- than a second: on a PostgreSQL distributed by tree a node's time is its worker's clock and a
-- conversation's the coordinator's, and a session continuing a fork makes its first node within
-- milliseconds of the fork -- a clock a little behind must not take that node from it. (A
-- conversation deleted and made again as a fork within the second keeps what it took; the fix
-- in bp_delete_conversation stops it from happening again.) Written as the difference of the two
-- times: Citus refuses a timestamp minus an interval beside a column in an UPDATE (a STABLE
-- operator), not the difference of two timestamps.

UPDATE nodes n SET conversation_id = n.conversation_id || ' (deleted)'
 WHERE strpos(n.conversation_id, ' ') = 0
   AND NOT EXISTS (SELECT 1 FROM conversations c WHERE c.tree_id = n.tree_id AND c.tenant = n.tenant
                                                  AND c.id = n.conversation_id);

UPDATE nodes n SET conversation_id = n.conversation_id || ' (deleted)'
  FROM conversations c
 WHERE c.tree_id = n.tree_id AND c.tenant = n.tenant AND c.id = n.conversation_id
   AND c.fork_node_id IS NOT NULL AND c.created_at - n.created_at > interval '1 second';
