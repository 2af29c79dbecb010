-- The server-side functions, by concern, in the order storage/migrate.py applies them after the
-- numbered migrations on every run (each file CREATE OR REPLACEs its functions, so they always
-- match the code). Later parts build on earlier ones: a SQL-language function's body is checked
-- when it is made, so what it calls must exist by then. Each file's header says what it holds
-- and which refusals and locks apply; basics.sql holds the rules for all (the refusal codes,
-- where the head moves, the lock order). Also runnable by hand: psql -f storage/functions.sql
\ir functions/basics.sql
\ir functions/paths.sql
\ir functions/calls.sql
\ir functions/matching.sql
\ir functions/moves.sql
\ir functions/retention.sql
\ir functions/conversations.sql
\ir functions/search.sql
