-- Server-side functions, part 7 of 7: the Conversations API's writes -- items added to a
-- conversation without a call (nodes of kind 'items'), its metadata.
--
-- Refusals: BPNFC (no such conversation, when it must exist), BPBSY (a turn call in flight, or the
-- head moved since the caller read it), BPNFN (a parent outside the conversation's reach).
-- Locks: the conversation row FOR UPDATE (the head moves) before any node row; a dead process's
-- lease is reaped first (bp_check_lease). Every statement on nodes names its tree (Citus routes it
-- there: docs/scaling.md).

-- bp_add_items(tenant, conversation, spare tree, create, metadata, parent mode, parent, expected
-- head, nodes): one or more nodes of kind 'items', each under the one before it, the first under
-- the head (`parent mode` 'head') or under `parent` ('node'; null: a root) -- and the head moves
-- to the last. `create`: the conversation is made if it does not exist yet (in `spare`'s tree,
-- as bp_open_conversation does), with `metadata`; else it must exist (BPNFC). `expected head`
-- (parent mode 'node' only): the head the caller read; another one refuses with BPBSY (something
-- moved it meanwhile). `nodes`: a jsonb array of {id, sent, digests (hex strings: the transcript
-- digests of its non-system messages), system_hash (hex or null), answered (it holds an
-- assistant message)}. Each node is a success with nothing received: its items are context.
-- Returns the conversation's tree.
CREATE OR REPLACE FUNCTION bp_add_items(p_tenant text, p_conversation text, p_spare uuid, p_create boolean,
                                        p_metadata jsonb, p_parent_mode text, p_parent uuid, p_expected_head uuid,
                                        p_nodes jsonb)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
    conv conversations%ROWTYPE;
    v_ctree uuid := bp_conversation_tree(p_tenant, p_conversation);
    v_parent uuid;
    v_up record;
    v_node jsonb;
    v_digests bytea[];
BEGIN
    IF p_create THEN
        conv := bp_open_conversation(p_tenant, p_conversation, v_ctree, p_spare, true);
        IF conv.metadata IS NULL AND p_metadata IS NOT NULL THEN
            UPDATE conversations c SET metadata = p_metadata
             WHERE c.tree_id = conv.tree_id AND c.tenant = p_tenant AND c.id = p_conversation;
        END IF;
    ELSE
        conv := bp_locked_conversation(p_tenant, p_conversation);
    END IF;
    conv := bp_check_lease(conv);
    IF p_parent_mode = 'node' THEN
        IF conv.head_node_id IS DISTINCT FROM p_expected_head THEN
            PERFORM bp_refuse('BPBSY', format('the head of conversation %L moved meanwhile; retry', p_conversation));
        END IF;
        IF p_parent IS NOT NULL AND NOT bp_node_in_conversation(conv.tree_id, p_tenant, p_conversation, p_parent) THEN
            PERFORM bp_refuse('BPNFN', format('node %s is not part of conversation %L', p_parent, p_conversation));
        END IF;
        v_parent := p_parent;
    ELSE
        v_parent := conv.head_node_id;
    END IF;
    FOR v_node IN SELECT e FROM jsonb_array_elements(p_nodes) e LOOP
        v_digests := ARRAY(SELECT decode(substr(d, 3), 'hex') FROM jsonb_array_elements_text(v_node -> 'digests') d);
        SELECT n.depth, n.chain, n.answered, n.system_hash INTO v_up
          FROM nodes n WHERE n.tree_id = conv.tree_id AND n.id = v_parent;
        v_now := clock_timestamp();  -- (not inside the statement: Citus refuses volatile calls there)
        INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, outcome, sent, params,
                           depth, created_at, finished_at, chain, answered, system_hash, api)
        VALUES (conv.tree_id, (v_node ->> 'id')::uuid, p_tenant, p_conversation, v_parent, 'items', 'success',
                v_node -> 'sent', coalesce(v_node -> 'params', '{}'::jsonb), coalesce(v_up.depth + 1, 0), v_now, v_now,
                bp_fold(coalesce(v_up.chain, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea),
                        v_digests),
                coalesce(v_up.answered, false) OR coalesce((v_node ->> 'answered')::boolean, false),
                coalesce(decode(substr(v_node ->> 'system_hash', 3), 'hex'), v_up.system_hash), 'responses');
        v_parent := (v_node ->> 'id')::uuid;
    END LOOP;
    v_now := clock_timestamp();
    UPDATE conversations c SET head_node_id = v_parent, updated_at = v_now
     WHERE c.tree_id = conv.tree_id AND c.tenant = p_tenant AND c.id = p_conversation;
    RETURN conv.tree_id;
END
$$;

-- bp_set_metadata(tenant, conversation, metadata): replace a conversation's metadata -- activity,
-- as a turn is: retention's idleness counts from it (updated_at). Refuses with BPNFC when there is
-- no such conversation.
CREATE OR REPLACE FUNCTION bp_set_metadata(p_tenant text, p_conversation text, p_metadata jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    conv conversations%ROWTYPE;
    v_now timestamptz;
BEGIN
    conv := bp_locked_conversation(p_tenant, p_conversation);
    v_now := clock_timestamp();  -- (not inside the statement: Citus refuses volatile calls there)
    UPDATE conversations c SET metadata = p_metadata, updated_at = v_now
     WHERE c.tree_id = conv.tree_id AND c.tenant = p_tenant AND c.id = p_conversation;
END
$$;
