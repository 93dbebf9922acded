-- The SQLite workload: bulk insert, index builds, joins, aggregates,
-- updates and deletes over generated data (deterministic: no random()).
CREATE TABLE item(id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, price REAL, qty INTEGER);
CREATE TABLE grp(id INTEGER PRIMARY KEY, label TEXT);
BEGIN;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 400000)
INSERT INTO item SELECT x, (x * 7919) % 1000, 'item-' || ((x * 104729) % 400000),
       ((x * 31337) % 10000) / 100.0, (x * 17) % 50 FROM c;
WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM c LIMIT 1000)
INSERT INTO grp SELECT x, 'group-' || printf('%04d', x) FROM c;
COMMIT;
CREATE INDEX item_grp ON item(grp);
CREATE INDEX item_name ON item(name);
SELECT count(*), sum(qty), round(avg(price), 4) FROM item;
SELECT g.label, count(*), round(sum(i.price * i.qty), 2) FROM item i JOIN grp g ON g.id = i.grp
 GROUP BY g.id ORDER BY 3 DESC LIMIT 5;
SELECT count(*) FROM item WHERE name LIKE 'item-1%5';
SELECT count(DISTINCT substr(name, 6, 3)) FROM item;
BEGIN;
UPDATE item SET price = price * 1.1 WHERE grp % 3 = 0;
DELETE FROM item WHERE qty = 0;
COMMIT;
SELECT grp, max(price), min(price) FROM item GROUP BY grp HAVING count(*) > 190 ORDER BY grp LIMIT 5;
SELECT a.id, b.id FROM item a JOIN item b ON a.name = b.name AND a.id < b.id ORDER BY a.id LIMIT 3;
SELECT count(*) FROM (SELECT name FROM item ORDER BY name DESC, id LIMIT 100000);
