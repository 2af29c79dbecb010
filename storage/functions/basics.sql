-- Server-side functions, part 1 of 6 (storage/functions.sql lists them in the order they are
-- applied): the shared basics every other part builds on -- the head rule, refusals, token counts,
-- the tree a conversation lives in, the transcript hash, the conversation row's lock.
--
-- Why functions at all: the start of a call needs a handful of dependent decisions (lease, parent,
-- retry recognition, insert, path read) that must happen atomically; one function call is one
-- round trip and one transaction, and reads top to bottom like the rules it implements
-- (docs/behaviour.md). Python calls them with named arguments (p_name => $n), so each parameter
-- list is documented here only. Every part is re-applied (CREATE OR REPLACE) by every migration
-- run, after the numbered migrations, so the functions always match the code.
--
-- Distributed (Citus, docs/scaling.md): every function that reads a table is PL/pgSQL, so each of
-- its statements is planned with its arguments' values and Citus routes it to the one shard of the
-- tree it names (a SQL-language function's parameters cannot be routed); a statement on a table
-- never calls a function that reads a table itself (the shard it is sent to could not run it): such
-- a value is computed into a variable first. The pure helpers (no table) stay SQL. `branchpoint
-- distribute` places the functions that take a tree (p_tree) on the worker holding that tree.
--
-- Refusals: a rule that says no raises one of our own SQLSTATEs (bp_refuse), and nothing is
-- written (the transaction is rolled back). storage/errors.py translates them into `Refused`
-- exceptions:
--     BPBSY  busy                      a turn call of the conversation is in flight
--     BPNFC  conversation_not_found
--     BPNFN  node_not_found            not in this conversation's reach, or another tenant's
--     BPPBC  parent_before_compaction  an edit before a compaction of the current path
--     BPEXI  conversation_exists
--     BPPND  node_pending              a head cannot rest on a node still in flight
--
-- Where the head moves (the only places that write conversations.head_node_id):
--     bp_finish_call        a turn call ends: to its node iff bp_can_be_head(kind, outcome)    (calls.sql)
--                           (a node its finish writes again, its start lost: only if nothing moved)
--     bp_reap               a dead process's turn call: to its node (interrupted = transient)  (retention.sql)
--     bp_apply_compaction   to the new compaction node (a background one only if nothing moved)
--     bp_set_head           PUT /admin/conversations/{id}/head
--     bp_switch             POST /admin/conversations/{id}/switch (down to a leaf that can be head)
--     bp_fork               a new conversation starts with its head on the fork node  (these four: moves.sql)
-- bp_begin_call never moves the head; it chooses the new node's parent (the head, a given node,
-- or -- for a retry of a failed call -- the failed node's parent).
--
-- Lock order, everywhere: the conversation row first (bp_lock_conversation, bp_open_conversation
-- here; FOR UPDATE for anything that takes the lease or moves the head, FOR KEY SHARE for calls
-- that run side by side), then node rows, so two of these functions never wait on each other in
-- a cycle. A new name is claimed under a transaction advisory lock (bp_claim_name).

-- bp_can_be_head(kind, outcome): THE head rule. A node may carry the head when it is a turn (or
-- the compaction node standing for one, or items added without a call: kind 'items') that
-- succeeded, or that failed transiently -- its sent items (e.g. paid-for tool results) stay in
-- context and a retry hangs under or beside it. An overflow or an invalid request must not:
-- every later turn would fail the same way. Transforms never carry it; pending nodes (outcome
-- null) neither.
CREATE OR REPLACE FUNCTION bp_can_be_head(p_kind text, p_outcome text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_kind IN ('turn', 'compaction', 'items') AND p_outcome IN ('success', 'transient')
$$;

-- bp_token_count(usage, key, other key): a token count of a node's reported usage -- the count
-- at `key`, else at `other key` (chat calls report prompt/completion tokens, Responses calls
-- input/output), else null. Only an integer written as one, from 0 to 10^9, is a count (as
-- /metrics counts them): anything else -- a string, a negative, fractional or absurd number, from
-- an upstream's odd answer or an import -- counts as none (and the other key is read instead).
CREATE OR REPLACE FUNCTION bp_token_count(p_usage jsonb, p_key text, p_other text)
RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- (one expression, so that PostgreSQL inlines it into the sums; the cast only under its CASE)
    SELECT coalesce(
        CASE WHEN jsonb_typeof(p_usage -> p_key) = 'number' AND (p_usage ->> p_key) ~ '^[0-9]{1,10}$' THEN
            CASE WHEN (p_usage ->> p_key)::numeric <= 1000000000 THEN (p_usage ->> p_key)::numeric END END,
        CASE WHEN jsonb_typeof(p_usage -> p_other) = 'number' AND (p_usage ->> p_other) ~ '^[0-9]{1,10}$' THEN
            CASE WHEN (p_usage ->> p_other)::numeric <= 1000000000 THEN (p_usage ->> p_other)::numeric END END)
$$;

-- bp_token_total(sum): a sum of token counts as a bigint (0 for none; held within bigint's range
-- whatever an upstream reported).
CREATE OR REPLACE FUNCTION bp_token_total(p_sum numeric)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(least(coalesce(p_sum, 0), 9223372036854775807), -9223372036854775808)::bigint
$$;

-- bp_prompt_tokens(usage): a node's prompt tokens in any API's terms -- chat's prompt_tokens,
-- Responses' input_tokens (with its input_tokens_details), or Anthropic's input_tokens with its
-- cache's reads and writes added back (they leave them out); null when none is reported. As
-- proxy/tokens.py's reported_prompt.
CREATE OR REPLACE FUNCTION bp_prompt_tokens(p_usage jsonb)
RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- (one expression, so that PostgreSQL inlines it into the sums)
    SELECT coalesce(bp_token_count(p_usage, 'prompt_tokens', 'prompt_tokens'),
                    CASE WHEN jsonb_typeof(p_usage -> 'input_tokens_details') = 'object'
                         THEN bp_token_count(p_usage, 'input_tokens', 'input_tokens')
                         ELSE bp_token_count(p_usage, 'input_tokens', 'input_tokens')
                              + coalesce(bp_token_count(p_usage, 'cache_read_input_tokens', 'cache_read_input_tokens'), 0)
                              + coalesce(bp_token_count(p_usage, 'cache_creation_input_tokens',
                                                        'cache_creation_input_tokens'), 0) END)
$$;

-- bp_cached_tokens(usage): of them, those that went through a provider's prompt cache -- read
-- from it (chat's prompt_tokens_details.cached_tokens, Responses' input_tokens_details.cached_tokens,
-- Anthropic's cache_read_input_tokens) and written to it (cache_creation_input_tokens: Anthropic's,
-- and carried beside chat's or Responses' fields by a translated call); null when none is
-- reported. As proxy/tokens.py's cached_prompt.
CREATE OR REPLACE FUNCTION bp_cached_tokens(p_usage jsonb)
RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- (one expression, so that PostgreSQL inlines it: reads + writes, else either)
    SELECT coalesce(coalesce(bp_token_count(p_usage -> 'prompt_tokens_details', 'cached_tokens', 'cached_tokens'),
                             bp_token_count(p_usage -> 'input_tokens_details', 'cached_tokens', 'cached_tokens'),
                             bp_token_count(p_usage, 'cache_read_input_tokens', 'cache_read_input_tokens'))
                    + bp_token_count(p_usage, 'cache_creation_input_tokens', 'cache_creation_input_tokens'),
                    bp_token_count(p_usage -> 'prompt_tokens_details', 'cached_tokens', 'cached_tokens'),
                    bp_token_count(p_usage -> 'input_tokens_details', 'cached_tokens', 'cached_tokens'),
                    bp_token_count(p_usage, 'cache_read_input_tokens', 'cache_read_input_tokens'),
                    bp_token_count(p_usage, 'cache_creation_input_tokens', 'cache_creation_input_tokens'))
$$;

-- bp_refuse(code, message): raise a refusal (see the table above).
CREATE OR REPLACE FUNCTION bp_refuse(p_code text, p_message text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = p_code, MESSAGE = p_message;
END
$$;

-- bp_conversation_tree(tenant, conversation): the tree a conversation lives in -- or would be
-- made in: its derived tree bp_tree_of(tenant, id), unless an alias row there says otherwise (a
-- fork, or a name made again while its old tree is still used: docs/scaling.md). Reads only rows
-- of that derived tree.
CREATE OR REPLACE FUNCTION bp_conversation_tree(p_tenant text, p_conversation text)
RETURNS uuid
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_tree uuid := bp_tree_of(p_tenant, p_conversation);
    v_target uuid;
BEGIN
    SELECT a.target INTO v_target FROM conversation_aliases a
     WHERE a.tree_id = v_tree AND a.tenant = p_tenant AND a.id = p_conversation;
    RETURN coalesce(v_target, v_tree);
END
$$;

-- bp_conversation_row(tenant, conversation): the conversation's row, where bp_conversation_tree
-- says it lives (none: no rows). What a query reads a conversation by name through: its tree is
-- worked out first, so the row is read from that one tree (on Citus a statement on a table
-- cannot call a function that reads a table).
CREATE OR REPLACE FUNCTION bp_conversation_row(p_tenant text, p_conversation text)
RETURNS SETOF conversations
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_tree uuid := bp_conversation_tree(p_tenant, p_conversation);
BEGIN
    RETURN QUERY SELECT * FROM conversations c
                  WHERE c.tree_id = v_tree AND c.tenant = p_tenant AND c.id = p_conversation;
END
$$;

-- bp_conversation_state(tenant, conversation): where the conversation's head is, and whether a
-- turn call is in flight (no rows: no such conversation).
CREATE OR REPLACE FUNCTION bp_conversation_state(p_tenant text, p_conversation text)
RETURNS TABLE (head_node_id uuid, busy boolean)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_tree uuid := bp_conversation_tree(p_tenant, p_conversation);
BEGIN
    RETURN QUERY SELECT c.head_node_id, (c.lease_node_id IS NOT NULL AND c.lease_until > now())
                   FROM conversations c
                  WHERE c.tree_id = v_tree AND c.tenant = p_tenant AND c.id = p_conversation;
END
$$;

-- bp_conversation_counts(tree, tenant, conversation): the nodes a conversation made and the tokens
-- upstreams reported for them (bp_prompt_tokens, completion/output, bp_cached_tokens -- as the
-- usage report sums them, storage/queries/ops.py): an imported fork's copies of its source's
-- nodes (params._bp_inherited) are its nodes, but their calls were counted in the source.
-- One tree's rows: the admin API's lists call it per conversation listed (a conversation row and
-- its counts in one statement would be a lateral aggregate over every shard, which Citus cannot run).
CREATE OR REPLACE FUNCTION bp_conversation_counts(p_tree uuid, p_tenant text, p_conversation text,
                                                  OUT node_count bigint, OUT prompt_tokens bigint,
                                                  OUT completion_tokens bigint, OUT cached_tokens bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT count(*), bp_token_total(sum(bp_prompt_tokens(n.usage)) FILTER (WHERE NOT n.params ? '_bp_inherited')),
           bp_token_total(sum(bp_token_count(n.usage, 'completion_tokens', 'output_tokens'))
                          FILTER (WHERE NOT n.params ? '_bp_inherited')),
           bp_token_total(sum(bp_cached_tokens(n.usage)) FILTER (WHERE NOT n.params ? '_bp_inherited'))
      INTO node_count, prompt_tokens, completion_tokens, cached_tokens
      FROM nodes n WHERE n.tree_id = p_tree AND n.tenant = p_tenant AND n.conversation_id = p_conversation;
END
$$;

-- bp_claim_name(tenant, conversation, spare): make room for a new conversation of this name and
-- return the tree it is made in: its derived tree, or -- when that tree still holds nodes (of a
-- deleted conversation of this name, kept for its forks) -- `spare`, recorded in an alias row.
-- Takes the name's lock (a transaction advisory lock on the derived tree), so two first calls,
-- or a first call and a fork, of one name never both create it. Returns null when the name is
-- taken meanwhile (re-read the conversation).
CREATE OR REPLACE FUNCTION bp_claim_name(p_tenant text, p_conversation text, p_spare uuid)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_tree uuid := bp_tree_of(p_tenant, p_conversation);
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(v_tree::text, 0));
    IF EXISTS (SELECT 1 FROM conversation_aliases a WHERE a.tree_id = v_tree AND a.tenant = p_tenant
                                                     AND a.id = p_conversation)
       OR EXISTS (SELECT 1 FROM conversations c WHERE c.tree_id = v_tree AND c.tenant = p_tenant
                                                 AND c.id = p_conversation) THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM nodes n WHERE n.tree_id = v_tree) THEN
        RETURN v_tree;
    END IF;
    INSERT INTO conversation_aliases (tree_id, tenant, id, target) VALUES (v_tree, p_tenant, p_conversation, p_spare);
    RETURN p_spare;
END
$$;

-- bp_fold(start, digests): the transcript hash chain folded over message digests:
-- h := sha256(h || d) for each d (storage/transcript.py computes the digests).
CREATE OR REPLACE FUNCTION bp_fold(p_start bytea, p_digests bytea[])
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    h bytea := p_start;
    d bytea;
BEGIN
    FOREACH d IN ARRAY coalesce(p_digests, '{}') LOOP
        h := sha256(h || d);
    END LOOP;
    RETURN h;
END
$$;

-- bp_define_type(name, attributes): the composite type `name` with these attributes (as CREATE TYPE
-- ... AS (attributes) spells them) -- made, or dropped and made again, only when it is not already
-- exactly that: its comment holds the attributes it was made with. What the functions files use
-- for the types they read contracts into (a type cannot be CREATE OR REPLACEd; making it only on
-- a change also leaves it alone for a role that owns the functions but not the type). The DROP
-- refuses when something depends on the type (a column, a function's argument or result).
CREATE OR REPLACE FUNCTION bp_define_type(p_name text, p_attributes text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF to_regtype(p_name) IS NOT NULL THEN
        IF obj_description(to_regtype(p_name)::oid, 'pg_type') IS NOT DISTINCT FROM p_attributes THEN
            RETURN;
        END IF;
        EXECUTE format('DROP TYPE %I', p_name);
    END IF;
    EXECUTE format('CREATE TYPE %I AS (%s)', p_name, p_attributes);
    EXECUTE format('COMMENT ON TYPE %I IS %L', p_name, p_attributes);
END
$$;

-- bp_lock_conversation(tree, tenant, conversation, for update): the conversation's row locked FOR
-- UPDATE (turn calls) or FOR KEY SHARE (side calls: they run side by side, but never beside a
-- delete of their conversation, which could otherwise remove the parent they hang under); a row
-- of nulls when there is none.
CREATE OR REPLACE FUNCTION bp_lock_conversation(p_tree uuid, p_tenant text, p_conversation text, p_for_update boolean)
RETURNS conversations
LANGUAGE plpgsql AS $$
DECLARE
    conv conversations%ROWTYPE;
BEGIN
    IF p_for_update THEN
        SELECT * INTO conv FROM conversations c
         WHERE c.tree_id = p_tree AND c.tenant = p_tenant AND c.id = p_conversation FOR UPDATE;
    ELSE
        SELECT * INTO conv FROM conversations c
         WHERE c.tree_id = p_tree AND c.tenant = p_tenant AND c.id = p_conversation FOR KEY SHARE;
    END IF;
    RETURN conv;
END
$$;

-- bp_open_conversation(tenant, conversation, tree, spare, for update): the conversation's row,
-- locked FOR UPDATE (turn calls) or FOR KEY SHARE -- made now if this is its first call, in the
-- tree bp_claim_name gives it. `tree`: bp_conversation_tree(tenant, conversation).
CREATE OR REPLACE FUNCTION bp_open_conversation(p_tenant text, p_conversation text, p_tree uuid, p_spare uuid,
                                                p_for_update boolean)
RETURNS conversations
LANGUAGE plpgsql AS $$
DECLARE
    conv conversations%ROWTYPE;
    v_tree uuid := p_tree;
BEGIN
    LOOP
        conv := bp_lock_conversation(v_tree, p_tenant, p_conversation, p_for_update);
        IF conv.id IS NOT NULL THEN
            RETURN conv;
        END IF;
        v_tree := bp_claim_name(p_tenant, p_conversation, p_spare);
        IF v_tree IS NOT NULL THEN
            INSERT INTO conversations (tenant, id, tree_id) VALUES (p_tenant, p_conversation, v_tree)
            RETURNING * INTO conv;
            RETURN conv;
        END IF;
        v_tree := bp_conversation_tree(p_tenant, p_conversation);  -- made meanwhile: read it there
    END LOOP;
END
$$;

-- bp_conversation_at(tenant, conversation, at, for update): the conversation as a start run beside
-- tree `at` finds it (bp_begin_call_at) -- reading rows of that tree only: its row locked as
-- bp_lock_conversation locks it, when it lives in `at`; else a row of nulls whose tree_id says
-- where it lives (an alias row in `at`, when `at` is the name's derived tree: a fork), or is null
-- (not known there: a new name, or one deleted or made again meanwhile -- the caller starts again
-- without a tree, and may claim the name).
CREATE OR REPLACE FUNCTION bp_conversation_at(p_tenant text, p_conversation text, p_at uuid, p_for_update boolean)
RETURNS conversations
LANGUAGE plpgsql AS $$
DECLARE
    conv conversations%ROWTYPE;
    v_tree uuid := p_at;
BEGIN
    IF p_at = bp_tree_of(p_tenant, p_conversation) THEN
        v_tree := bp_conversation_tree(p_tenant, p_conversation);  -- (its alias row: in `at`)
    END IF;
    IF v_tree = p_at THEN
        conv := bp_lock_conversation(p_at, p_tenant, p_conversation, p_for_update);
        IF conv.id IS NOT NULL THEN
            RETURN conv;
        END IF;
        v_tree := NULL;
    END IF;
    conv.tree_id := v_tree;
    RETURN conv;
END
$$;
