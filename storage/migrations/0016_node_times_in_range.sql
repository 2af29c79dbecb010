-- 0016: node times held within the years 1 to 9999 in UTC.
--
-- Why: an import took any time PostgreSQL could hold -- `9999-12-31T23:59:59-14:00` is year 10000
-- in UTC -- and no reader could read such a row back (Python's datetime stops at 9999): the
-- conversation's tree and export answered 500, the command's export died. Imports refuse such
-- times now (proxy/transfer.py); what was imported before is brought to the nearest time both
-- hold, so those conversations read again.

UPDATE nodes n
   SET created_at = least(greatest(n.created_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00'),
       finished_at = CASE WHEN n.finished_at IS NOT NULL  -- (greatest() would make a null a time)
                          THEN least(greatest(n.finished_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59.999999+00') END
 WHERE n.created_at NOT BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'
    OR n.finished_at NOT BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00';
