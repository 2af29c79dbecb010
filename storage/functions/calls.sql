-- Server-side functions, part 3 of 6: a call -- its start (bp_begin_call; full-history starts
-- continue in matching.sql), its finish, its lease kept alive. The start and the finish each take
-- their contract whole, as one jsonb argument (storage.tree.CallStart, CallFinish), read into one
-- composite type each (bp_call_start_t, bp_call_finish_t) by jsonb_populate_record: a new field is
-- one edit in the struct and one in its type.
--
-- Refusals: the start refuses with BPBSY (the lease, bp_check_lease), BPNFN (a parent outside the
-- conversation's reach) or BPPBC (an edit before a compaction); the finish and the renewal never
-- refuse (false: the node is no longer pending; the finish's null: it is not there).
-- Durability: the start commits without waiting for the disk, and a start a crash lost is written
-- again by the finish (bp_restore_start; docs/architecture.md#durability).
-- Locks: a turn call locks its conversation row FOR UPDATE (start: it takes the lease; finish: it
-- moves the head), a transform or full-history call FOR KEY SHARE (start) or not at all (finish)
-- -- always before any node row.

-- bp_call_start_t: a call's start as storage.tree.CallStart sends it -- the one place its fields
-- are named in SQL. bp_begin_call and bp_begin_full read the jsonb into it in one C-level call,
-- jsonb_populate_record(NULL::bp_call_start_t, start): fields by name, bytes as hex strings
-- ('\x...', bytea's own input), arrays and jsonb natively, no field parsed twice. Adding a field:
-- one line here and one in the struct (tests/test_schema.py checks they match). Every field
-- travels, defaults included (the struct holds the defaults). Made by bp_define_type (basics.sql):
-- again only when its attributes change, before the functions that read it; no function takes or
-- returns it and nothing is stored as it, so dropping it never cascades (it refuses if that
-- ever changes).
--   tenant, conversation_id   who and which conversation (full mode: null = find it by content)
--   new_conversation_id       the id a conversation found by nothing gets (full mode, no id)
--   new_tree_id               the tree id a new conversation gets
--   node_id                   the new node's id (made by the caller, so it is known even if the
--                             start's answer is lost)
--   kind                      turn | transform
--   mode                      delta (sent are the new items) | full (sent is the whole history)
--   parent_mode, parent_id    delta: head | root | node (parent_id)
--   sent                      the call's messages
--   digests                   the digests of its non-system messages, in order
--   prefixes                  the transcript hashes of its first 1..m non-system messages (in delta
--                             mode given when it could be a resent history -- it holds an assistant
--                             message: bp_begin_call's safety net)
--   prefix_offset             full mode: the prefixes and sent's non-system messages start after
--                             this many (a window at the end of a long history: the deepest match
--                             is almost always there); 0 = complete
--   system_hash               the hash of its system/developer messages (null: none)
--   lease_seconds, model, provider, params (the request's other fields)
--   ordinals                  Responses items: the message each item of sent stands for (bp_tail)
--   api                       chat | responses: the format sent is in
--   tree_id                   the tree the caller looks for the conversation in, set by
--                             bp_begin_call_at (the start runs on the node holding that tree): the
--                             start then reads no other tree and claims no name -- a conversation
--                             not there answers 'elsewhere' (bp_conversation_at); null: look it up
--                             by name, and make it if it is new
--   restorable                the caller's finish writes the start again if a crash lost it
--                             (bp_restore_start): then, and only then, the start's commit does not
--                             wait for the disk. A process of a version before this field (a
--                             rolling upgrade: it calls the new functions) sends none, sends no
--                             restore with its finish either, and its starts commit as they did
SELECT bp_define_type('bp_call_start_t', '
    tenant text, conversation_id text, new_conversation_id text, new_tree_id uuid, tree_id uuid,
    node_id uuid, kind text, mode text, parent_mode text, parent_id uuid,
    sent jsonb, digests bytea[], prefixes bytea[], prefix_offset integer,
    system_hash bytea, lease_seconds double precision, model text, provider text,
    params jsonb, ordinals integer[], api text, restorable boolean');

-- bp_call_finish_t: how a call ended, as storage.tree.CallFinish sends it -- read by
-- bp_finish_call as bp_call_start_t is read (made the same way; a field: a line here and the struct):
--   outcome            success | transient | overflow | invalid
--   received           the items the model returned (success), else null
--   received_digests   their digests (storage/transcript.py)
--   usage, finish_reason, error ({type, code, message, status}, failures)
--   request_hash       sha256 of the exact body sent upstream (null: none was sent)
--   leased             whether the call took the conversation's lease (delta turn calls)
--   restore            the call's start as it ran, for when the database lost it (bp_restore_start
--                      reads it); null: a missing node is left missing
SELECT bp_define_type('bp_call_finish_t', '
    outcome text, received jsonb, received_digests bytea[], usage jsonb, finish_reason text,
    error jsonb, request_hash bytea, leased boolean, restore jsonb');

-- bp_check_lease(conversation row): refuse (busy) while another turn call holds the lease; a dead
-- process's lease is reaped first. Returns the conversation row as it is afterwards.
CREATE OR REPLACE FUNCTION bp_check_lease(p_conv conversations)
RETURNS conversations
LANGUAGE plpgsql AS $$
DECLARE
    conv conversations := p_conv;
BEGIN
    IF conv.lease_node_id IS NOT NULL THEN
        IF conv.lease_until > now() THEN
            PERFORM bp_refuse('BPBSY', format('conversation %L has a turn call in flight; retry when it has finished', conv.id));
        END IF;
        PERFORM bp_reap(conv.tree_id, conv.lease_node_id);
        SELECT * INTO conv FROM conversations c WHERE c.tree_id = conv.tree_id AND c.tenant = conv.tenant AND c.id = conv.id;
        IF conv.lease_node_id IS NOT NULL THEN
            PERFORM bp_refuse('BPBSY', format('conversation %L has a turn call in flight; retry when it has finished', conv.id));
        END IF;
    END IF;
    RETURN conv;
END
$$;

-- bp_begin_call(start, known): start one call in one round trip -- the conversation (created by
-- its first call), the lease (delta turn calls only), the parent, the pending node, the parent's
-- path. `start`: the call (bp_call_start_t says what it holds); `known`: nodes whose path the
-- caller already has (its path cache): the returned path ends above the first of them it meets.
-- Returns the chosen parent's path root first as rows (call_node, conversation_id, tree_id,
-- parent_id, mode, matched, start, with_system, node) -- one row with a null node when the new
-- node is a root, or when the parent itself is known. `call_node` is the new node's id (how a
-- batch tells its calls' rows apart), `mode` the mode that handled the call, `matched` how many
-- of its non-system messages matched stored nodes (full mode), `start` how many of them the new
-- node does not repeat, `with_system` whether it stores the call's system messages (full mode:
-- only when they differ from the path's). `mode` is 'window' (nothing written) when a window at
-- the end did not suffice: call again with the whole history; 'elsewhere' (nothing written) when
-- the start was given a tree (`tree_id`) and the conversation is not there: its `tree_id` names
-- the tree it is in (start again there), or is null (start again without a tree). Refuses with
-- BPBSY, BPNFN or BPPBC (delta mode).
CREATE OR REPLACE FUNCTION bp_begin_call(p_start jsonb, p_known uuid[] DEFAULT '{}')
RETURNS TABLE (call_node uuid, conversation_id text, tree_id uuid, parent_id uuid, mode text, matched integer,
               start integer, with_system boolean, node bp_path_node)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    s bp_call_start_t := jsonb_populate_record(NULL::bp_call_start_t, p_start);
    conv conversations%ROWTYPE;
    v_parent uuid;
    v_head record;
    v_up record;
    v_lease timestamptz;
    v_resent boolean;
    v_above bytea;
BEGIN
    -- the start's commit does not wait for the disk: what a crash could lose of it, the finish
    -- writes again (bp_restore_start; docs/architecture.md#durability) -- a finish that can
    IF s.restorable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    IF s.mode = 'full' THEN
        RETURN QUERY SELECT * FROM bp_begin_full(p_start, p_known);
        RETURN;
    END IF;

    v_lease := now() + make_interval(secs => s.lease_seconds);

    -- 1. the conversation, locked for the rest of this transaction (turns only: transforms take
    --    no lease and move no head, so any number of them run side by side)
    IF s.tree_id IS NOT NULL THEN
        -- run beside a tree (bp_begin_call_at): the conversation must be there
        conv := bp_conversation_at(s.tenant, s.conversation_id, s.tree_id, s.kind = 'turn');
        IF conv.id IS NULL THEN
            RETURN QUERY SELECT s.node_id, NULL::text, conv.tree_id, NULL::uuid, 'elsewhere', 0, 0, false,
                                NULL::bp_path_node;
            RETURN;
        END IF;
    ELSIF s.parent_mode = 'node' THEN
        -- a given parent needs an existing conversation: never create one just to answer 404
        conv := bp_lock_conversation(bp_conversation_tree(s.tenant, s.conversation_id), s.tenant, s.conversation_id,
                                     s.kind = 'turn');
        IF conv.id IS NULL THEN
            PERFORM bp_refuse('BPNFN', format('node %s is not part of conversation %L', s.parent_id, s.conversation_id));
        END IF;
    ELSE
        conv := bp_open_conversation(s.tenant, s.conversation_id, bp_conversation_tree(s.tenant, s.conversation_id),
                                     s.new_tree_id, s.kind = 'turn');
    END IF;

    -- 2. the safety net: a delta client never resends the model's answers, so a delta call whose
    --    messages hold an answer stored in this conversation's tree resends its history -- whether
    --    or not they begin with the parent's transcript (an app's side call, a title request, may
    --    have moved the head). It is handled in full-history mode (the whole history: no window).
    --    Two tests, the cheaper first: the parent's whole transcript (holding an answer) begins the
    --    messages -- one lookup by key; else one of the messages is a stored answer -- one probe
    --    of nodes_by_answer per message. (prefixes are only given when the messages hold an
    --    assistant message: an ordinary delta call, a question or tool results, probes nothing.)
    IF cardinality(s.prefixes) > 0 AND s.parent_mode <> 'root' THEN
        SELECT n.chain, n.answered INTO v_up FROM nodes n
         WHERE n.tree_id = conv.tree_id
           AND n.id = CASE WHEN s.parent_mode = 'node' THEN s.parent_id ELSE conv.head_node_id END;
        v_resent := FOUND AND v_up.answered AND v_up.chain = ANY(s.prefixes);
        IF NOT coalesce(v_resent, false) THEN
            PERFORM 1 FROM nodes n
             WHERE n.answer = ANY(s.digests) AND n.tree_id = conv.tree_id AND n.tenant = s.tenant
             LIMIT 1;
            v_resent := FOUND;
        END IF;
        IF v_resent THEN
            RETURN QUERY SELECT * FROM bp_begin_full(p_start || '{"prefix_offset": 0}', p_known);
            RETURN;
        END IF;
    END IF;

    -- 3. the in-flight lease
    IF s.kind = 'turn' THEN
        conv := bp_check_lease(conv);
    END IF;

    -- 4. the parent
    IF s.parent_mode = 'root' THEN
        v_parent := NULL;
    ELSIF s.parent_mode = 'node' THEN
        IF NOT bp_node_in_conversation(conv.tree_id, s.tenant, s.conversation_id, s.parent_id) THEN
            PERFORM bp_refuse('BPNFN', format('node %s is not part of conversation %L', s.parent_id, s.conversation_id));
        END IF;
        v_parent := s.parent_id;
        IF conv.compactions > 0 AND conv.head_node_id IS NOT NULL THEN
            v_parent := bp_parent_through_compaction(conv.tree_id, conv.head_node_id, s.parent_id);
            IF v_parent IS NULL THEN
                PERFORM bp_refuse('BPPBC', format(
                    'node %s lies before a compaction of this conversation''s path; it can no longer be edited '
                    'here (fork from it, or move the head there first)', s.parent_id));
            END IF;
        END IF;
    ELSE
        v_parent := conv.head_node_id;
        IF v_parent IS NOT NULL THEN
            SELECT n.parent_id, n.outcome, n.chain INTO v_head
              FROM nodes n WHERE n.tree_id = conv.tree_id AND n.id = v_parent;
            -- the retry rule: an SDK retry of a failed call (the same items) hangs beside the
            -- failed node, so the items appear once and the failed attempt stays as a branch
            IF s.kind = 'turn' AND v_head.outcome <> 'success' THEN
                SELECT n.chain INTO v_above FROM nodes n WHERE n.tree_id = conv.tree_id AND n.id = v_head.parent_id;
                IF v_head.chain = bp_fold(coalesce(v_above,
                                                   '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea),
                                          s.digests) THEN
                    v_parent := v_head.parent_id;
                END IF;
            END IF;
        END IF;
    END IF;

    -- 5. the pending node, and the lease it holds
    SELECT n.depth, n.chain, n.answered, n.system_hash INTO v_up
      FROM nodes n WHERE n.tree_id = conv.tree_id AND n.id = v_parent;
    INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, sent, model, provider, params,
                       depth, lease_until, chain, answered, system_hash, api)
    VALUES (conv.tree_id, s.node_id, s.tenant, s.conversation_id, v_parent, s.kind, s.sent, s.model, s.provider,
            coalesce(s.params, '{}'::jsonb), coalesce(v_up.depth + 1, 0), v_lease,
            bp_fold(coalesce(v_up.chain, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea), s.digests),
            coalesce(v_up.answered, false), coalesce(s.system_hash, v_up.system_hash), s.api);

    IF s.kind = 'turn' THEN
        v_now := clock_timestamp();  -- (not inside the statement: Citus refuses volatile calls there)
        UPDATE conversations c SET lease_node_id = s.node_id, lease_until = v_lease, updated_at = v_now
         WHERE c.tree_id = conv.tree_id AND c.tenant = s.tenant AND c.id = s.conversation_id;
    END IF;

    -- 6. the path the context is assembled from (one row with a null node when there is none
    --    to read: a root, or a parent the caller has)
    RETURN QUERY SELECT s.node_id, conv.id, conv.tree_id, v_parent, 'delta', 0, 0, false, p
      FROM bp_path_nodes(conv.tree_id, v_parent, p_known) p;
    IF NOT FOUND THEN
        RETURN QUERY SELECT s.node_id, conv.id, conv.tree_id, v_parent, 'delta', 0, 0, false, NULL::bp_path_node;
    END IF;
END
$$;

-- bp_begin_call_at(tree, start, known): bp_begin_call, beside a tree -- `tree` becomes the start's
-- tree_id (set here, so a caller trying one tree after another sends the same start each time): its
-- conversation's tree as the caller expects it (bp_tree_of(tenant, conversation), or where an
-- 'elsewhere' answer pointed). What a PostgreSQL distributed by tree runs a named
-- conversation's start as: placed with its tree (storage/distribute.py), the call runs whole on
-- the worker holding that tree, its statements local there. Never claims a name (a new
-- conversation answers 'elsewhere' with a null tree: its first call starts on the coordinator,
-- where every claim of a name takes the name's lock -- storage/tree.py). `known` as uuid[]'s text
-- ('{id,...}'): Citus, sending the call to the worker, could not pass on a cast of the text sent.
CREATE OR REPLACE FUNCTION bp_begin_call_at(p_tree uuid, p_start jsonb, p_known text DEFAULT '{}')
RETURNS TABLE (call_node uuid, conversation_id text, tree_id uuid, parent_id uuid, mode text, matched integer,
               start integer, with_system boolean, node bp_path_node)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_tree IS NULL THEN  -- (nothing to run beside: the caller starts on the coordinator instead)
        RAISE EXCEPTION 'bp_begin_call_at: no tree given';
    END IF;
    RETURN QUERY SELECT * FROM bp_begin_call(p_start || jsonb_build_object('tree_id', p_tree), p_known::uuid[]);
END
$$;

-- bp_restore_start(tree, node, restore): write a call's pending node again, as its start wrote it
-- -- for a start the database lost (it committed without waiting for the disk, and a crash came
-- first), found missing when the call finishes (bp_finish_call). `restore`: {call: the start as it
-- ran (bp_call_start_t), conversation_id, parent_id, mode, start, with_system: what it decided}.
-- The node hangs where the start put it, without the lease (lost with it). Nothing is written,
-- and false returned, when that place is gone: the parent, or the conversation (unless the node
-- was its first: then the conversation is made again, in its tree, if the name is still free).
CREATE OR REPLACE FUNCTION bp_restore_start(p_tree uuid, p_node uuid, p_restore jsonb)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    s bp_call_start_t := jsonb_populate_record(NULL::bp_call_start_t, p_restore -> 'call');
    v_conversation text := p_restore ->> 'conversation_id';
    v_parent uuid := (p_restore ->> 'parent_id')::uuid;
    v_full boolean := p_restore ->> 'mode' = 'full';
    conv conversations%ROWTYPE;
    v_up record;
BEGIN
    conv := bp_lock_conversation(p_tree, s.tenant, v_conversation, s.kind = 'turn');
    IF conv.id IS NULL THEN
        IF v_parent IS NOT NULL OR bp_claim_name(s.tenant, v_conversation, p_tree) IS DISTINCT FROM p_tree THEN
            RETURN false;
        END IF;
        INSERT INTO conversations (tenant, id, tree_id) VALUES (s.tenant, v_conversation, p_tree);
    END IF;
    SELECT n.depth, n.chain, n.answered, n.system_hash INTO v_up
      FROM nodes n WHERE n.tree_id = p_tree AND n.id = v_parent;
    IF v_parent IS NOT NULL AND NOT FOUND THEN
        RETURN false;
    END IF;
    -- as bp_begin_call (delta) or bp_begin_full (full) wrote it
    INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, sent, model, provider, params,
                       depth, lease_until, chain, answered, system_hash, api)
    VALUES (p_tree, p_node, s.tenant, v_conversation, v_parent, s.kind,
            CASE WHEN v_full THEN bp_tail(s.sent, (p_restore ->> 'start')::integer - s.prefix_offset,
                                          (p_restore ->> 'with_system')::boolean, s.ordinals)
                 ELSE s.sent END,
            s.model, s.provider, coalesce(s.params, '{}'::jsonb), coalesce(v_up.depth + 1, 0),
            now() + make_interval(secs => s.lease_seconds),
            CASE WHEN v_full THEN coalesce(s.prefixes[cardinality(s.prefixes)],
                                           '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea)
                 ELSE bp_fold(coalesce(v_up.chain, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea),
                              s.digests) END,
            coalesce(v_up.answered, false), coalesce(s.system_hash, v_up.system_hash), s.api);
    RETURN true;
END
$$;

-- bp_finish_call(tree, node, finish): store a call's outcome. A delta turn call releases the
-- conversation's lease if it still holds it; a full-history turn call never held one. Either way
-- the head moves to its node when bp_can_be_head says so (last finisher wins) -- a node written
-- again (its start lost, and its lease with it) only if no node begun after the call holds the
-- head: a turn let in meanwhile moved it, and the node stays a branch (a full-history call: last
-- finisher wins, as always). A success extends
-- the node's transcript hash by what the model returned, and a turn's keeps the digest of its
-- answer's first message (`answer`: the safety net's index, nodes_by_answer). Returns false when the node was no
-- longer pending (reaped meanwhile), null when it is not there (its start lost, and `restore` not
-- given or not possible; a node the finish writes again holds no lease): nothing is written then.
--   p_tree, p_node   the node (the tree: what a PostgreSQL distributed by tree routes the call by)
--   p_finish         how the call ended, as storage.tree.CallFinish sends it (bp_call_finish_t)
CREATE OR REPLACE FUNCTION bp_finish_call(p_tree uuid, p_node uuid, p_finish jsonb)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
    f bp_call_finish_t := jsonb_populate_record(NULL::bp_call_finish_t, p_finish);
    v record;
    v_head uuid;
    v_may_move boolean := true;
BEGIN
    SELECT n.tenant, n.conversation_id, n.kind INTO v FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node;
    IF NOT FOUND THEN
        IF f.restore IS NULL OR NOT bp_restore_start(p_tree, p_node, f.restore) THEN
            RETURN NULL;
        END IF;
        f.leased := false;
        SELECT n.tenant, n.conversation_id, n.kind, n.parent_id, n.chain INTO v
          FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node;
        -- the lease was lost with the start: another turn may have been let in since and moved
        -- the head (its client answered, its answer in context). The head moves onto this node
        -- only if no node begun after this call holds it -- node ids are version-7 UUIDs, which
        -- grow with the time they were made (storage/ids.py) -- as a background compaction moves
        -- it only if nothing moved (the conversation row is locked: bp_restore_start). A
        -- full-history call never held a lease: the last to finish takes the head, as always.
        IF v.kind = 'turn' AND f.restore ->> 'mode' IS DISTINCT FROM 'full' THEN
            SELECT c.head_node_id INTO v_head FROM conversations c
             WHERE c.tree_id = p_tree AND c.tenant = v.tenant AND c.id = v.conversation_id;
            v_may_move := v_head IS NULL OR v_head < p_node;
        END IF;
    END IF;
    IF v.kind = 'turn' THEN
        PERFORM 1 FROM conversations c WHERE c.tree_id = p_tree AND c.tenant = v.tenant AND c.id = v.conversation_id
           FOR UPDATE;
    END IF;
    v_now := clock_timestamp();  -- (not inside the statement: Citus refuses volatile calls there)
    UPDATE nodes n
       SET outcome = f.outcome, received = f.received, usage = f.usage,
           finish_reason = f.finish_reason, error = f.error,
           request_hash = coalesce(f.request_hash, n.request_hash),
           chain = CASE WHEN f.outcome = 'success' THEN bp_fold(n.chain, f.received_digests) ELSE n.chain END,
           answered = n.answered OR (f.outcome = 'success' AND jsonb_array_length(coalesce(f.received, '[]')) > 0),
           answer = CASE WHEN f.outcome = 'success' AND n.kind = 'turn' THEN f.received_digests[1] END,
           lease_until = NULL, finished_at = v_now
     WHERE n.tree_id = p_tree AND n.id = p_node AND n.outcome IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v.kind = 'turn' THEN
        v_now := clock_timestamp();  -- (not inside the statement: Citus refuses volatile calls there)
        UPDATE conversations c
           SET head_node_id = CASE WHEN bp_can_be_head(v.kind, f.outcome) AND v_may_move THEN p_node
                                   ELSE c.head_node_id END,
               lease_node_id = CASE WHEN f.leased THEN NULL ELSE c.lease_node_id END,
               lease_until = CASE WHEN f.leased THEN NULL ELSE c.lease_until END,
               updated_at = v_now
         WHERE c.tree_id = p_tree AND c.tenant = v.tenant AND c.id = v.conversation_id
           AND (CASE WHEN f.leased THEN c.lease_node_id = p_node ELSE true END);
    END IF;
    RETURN true;
END
$$;

-- bp_renew(tree, node, seconds): a live call keeps its leases (node, and the conversation's when
-- it holds it) from running out. Returns false when the node is no longer pending.
CREATE OR REPLACE FUNCTION bp_renew(p_tree uuid, p_node uuid, p_lease_seconds double precision)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v record;
    v_until timestamptz := now() + make_interval(secs => p_lease_seconds);
BEGIN
    SELECT n.tenant, n.conversation_id INTO v FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE conversations c SET lease_until = v_until
     WHERE c.tree_id = p_tree AND c.tenant = v.tenant AND c.id = v.conversation_id AND c.lease_node_id = p_node;
    UPDATE nodes n SET lease_until = v_until
     WHERE n.tree_id = p_tree AND n.id = p_node AND n.outcome IS NULL;
    RETURN FOUND;
END
$$;
