"""Every SQL statement Branchpoint runs, named, each with its purpose and its ``$n`` parameters --
grouped by what they serve, every name importable from here (``from storage import queries``;
``queries.BEGIN_CALL``):

    calls.py    a stored call's path: start, finish, lease, reaper, path read, compaction written
    admin.py    the Conversations and admin APIs: conversations, search, head moves, forks, paths
    ops.py      usage reports, retention, export and import, readiness, the invariants
    shared.py   large items stored once per tenant, and their sweep

Plain SQL, parameters always bound (never formatted in; the only composition is of column lists
taken from the row structs of ``storage.model``, and of the fixed conversation queries that
``admin._conversations`` gives their counts). The multi-step statements are server-side
functions in ``storage/functions/*.sql`` (in the order ``storage/functions.sql`` lists them),
called with named arguments, so their parameter lists are documented there only. (The applied
migrations, frozen, name this package as it was before: ``storage/queries.py``.)
"""

from .admin import (
    ADD_ITEMS,
    CHILDREN,
    CONVERSATION,
    CONVERSATION_METADATA,
    CONVERSATIONS_PAGE,
    DELETE_CONVERSATION,
    DELETE_RESPONSE,
    FORK,
    NODE,
    PATH,
    PATH_WITH_SIBLINGS,
    SEARCH,
    SET_HEAD,
    SET_METADATA,
    SUMMARISER_REQUEST,
    SWITCH,
    TENANTS_OF,
    TREE,
    VISIBLE_FOREIGN,
)
from .calls import (
    ABANDON,
    APPLY_COMPACTION,
    BEGIN_CALL,
    BEGIN_CALL_AT,
    CONTINUED_NODE,
    CONVERSATION_STATE,
    EXPIRED_PENDING,
    FINISH_CALL,
    NODE_CHAIN,
    NODE_PARAMS,
    PATH_NODES,
    REAP_NODE,
    RECORD_ATTEMPT,
    RENEW_LEASE,
    RESUMED_NODE,
    bytea_array,
    uuid_array,
)
from .ops import (
    EXPORT,
    HEADS,
    HEADS_OUTSIDE_TREE,
    IDLE_CANDIDATES,
    IDLE_COUNT,
    IMPORT_TREE,
    PENDING_COUNT,
    PRUNE,
    SCHEMA_VERSION,
    STALE_LEASES,
    STALE_PENDING,
    SUCCESS_WITHOUT_RECEIVED,
    USAGE,
)
from .shared import (
    SHARED_CANDIDATES,
    SHARED_DELETE,
    SHARED_LOAD,
    SHARED_REFERRED,
    SHARED_SEEN,
    SHARED_STORE,
)

__all__ = [
    "ABANDON",
    "ADD_ITEMS",
    "APPLY_COMPACTION",
    "BEGIN_CALL",
    "BEGIN_CALL_AT",
    "CHILDREN",
    "CONTINUED_NODE",
    "CONVERSATION",
    "CONVERSATIONS_PAGE",
    "CONVERSATION_METADATA",
    "CONVERSATION_STATE",
    "DELETE_CONVERSATION",
    "DELETE_RESPONSE",
    "EXPIRED_PENDING",
    "EXPORT",
    "FINISH_CALL",
    "FORK",
    "HEADS",
    "HEADS_OUTSIDE_TREE",
    "IDLE_CANDIDATES",
    "IDLE_COUNT",
    "IMPORT_TREE",
    "NODE",
    "NODE_CHAIN",
    "NODE_PARAMS",
    "PATH",
    "PATH_NODES",
    "PATH_WITH_SIBLINGS",
    "PENDING_COUNT",
    "PRUNE",
    "REAP_NODE",
    "RECORD_ATTEMPT",
    "RENEW_LEASE",
    "RESUMED_NODE",
    "SCHEMA_VERSION",
    "SEARCH",
    "SET_HEAD",
    "SET_METADATA",
    "SHARED_CANDIDATES",
    "SHARED_DELETE",
    "SHARED_LOAD",
    "SHARED_REFERRED",
    "SHARED_SEEN",
    "SHARED_STORE",
    "STALE_LEASES",
    "STALE_PENDING",
    "SUCCESS_WITHOUT_RECEIVED",
    "SUMMARISER_REQUEST",
    "SWITCH",
    "TENANTS_OF",
    "TREE",
    "USAGE",
    "VISIBLE_FOREIGN",
    "bytea_array",
    "uuid_array",
]
