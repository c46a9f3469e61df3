-- A node may reserve several ranges in one statement: reserve() takes how many, and
-- take_blocks() takes the place of take_block(). CREATE OR REPLACE cannot change an argument list
-- or a result type, so the old signatures go first. reserve()'s new argument has a default: a
-- node of the previous version calling reserve(name, node, wait) during a rolling upgrade still
-- gets its one range.
DROP FUNCTION IF EXISTS {{schema}}.reserve(text, uuid, integer);
DROP FUNCTION IF EXISTS {{schema}}.take_block(text);
