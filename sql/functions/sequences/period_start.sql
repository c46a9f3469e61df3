-- The local start of the period containing local_at for a reset of 'day', 'week' (ISO, from
-- Monday), 'month' or 'year'; '-infinity' for 'never'. A year may begin on the first of any
-- month: local_at is moved back by year_start - 1 months, truncated, and moved forward again.
-- One expression for every reset, as those months are 0 unless the reset is 'year'
-- (define_sequence() refuses another year start): it is inlined into the statements that take
-- numbers, where each branch and function named is built again on every call.
CREATE OR REPLACE FUNCTION {{schema}}.period_start(reset text, year_start integer, local_at timestamp) RETURNS date
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE
    WHEN reset = 'never' THEN '-infinity'::date
    ELSE (date_trunc(reset, local_at - (year_start - 1) * interval '1 month') + (year_start - 1) * interval '1 month')::date
  END
$$;
