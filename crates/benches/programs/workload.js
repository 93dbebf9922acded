// The QuickJS workload: object allocation and garbage collection, closures,
// string building, regular expressions, JSON and sorting; prints checksums.
function tree(d) { return d === 0 ? { l: null, r: null } : { l: tree(d - 1), r: tree(d - 1) }; }
function count(t) { return t.l === null ? 1 : 1 + count(t.l) + count(t.r); }
let nodes = 0;
for (let i = 0; i < 60; i++) nodes += count(tree(14));
print("nodes", nodes);

let words = [];
let seed = 12345;
function rnd() { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed; }
for (let i = 0; i < 60000; i++) {
  let w = "";
  const n = 3 + (rnd() % 8);
  for (let k = 0; k < n; k++) w += String.fromCharCode(97 + (rnd() % 26));
  words.push(w);
}
const sorted = words.slice().sort();
print("sorted", sorted[0], sorted[sorted.length - 1]);

const re = /([aeiou])([^aeiou\s]+)\1/g;
let matches = 0;
for (let i = 0; i < 20; i++) {
  const text = words.slice(i * 1000, i * 1000 + 3000).join(" ");
  matches += (text.match(re) || []).length;
}
print("matches", matches);

const objs = words.slice(0, 20000).map((w, i) => ({ w, i, up: w.toUpperCase(), len: w.length }));
let json = "", total = 0;
for (let r = 0; r < 4; r++) {
  json = JSON.stringify(objs);
  total += JSON.parse(json).reduce((s, o) => s + o.len, 0);
}
print("json", json.length, total);

const counts = new Map();
for (const w of words) { const k = w.slice(0, 2); counts.set(k, (counts.get(k) || 0) + 1); }
let best = [...counts.entries()].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).slice(0, 3);
print("prefixes", JSON.stringify(best));

function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
print("fib", fib(29));
