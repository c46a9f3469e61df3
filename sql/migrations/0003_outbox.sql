-- ordo 0003: transactional outbox (written in this session).
SELECT 1;
