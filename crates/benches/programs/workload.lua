-- The Lua workload: deep recursion (the interpreter re-enters itself for
-- every Lua call made from C: sort comparators, gsub callbacks, metamethods),
-- tables, strings and closures; prints checksums.
local function fib(n) if n < 2 then return n end return fib(n - 1) + fib(n - 2) end
local function ack(m, n)
  if m == 0 then return n + 1 end
  if n == 0 then return ack(m - 1, 1) end
  return ack(m - 1, ack(m, n - 1))
end
local function tree(d) if d == 0 then return {} end return { tree(d - 1), tree(d - 1) } end
local function count(t) local n = 1 for _, c in ipairs(t) do n = n + count(c) end return n end

print("fib", fib(27))
print("ack", ack(2, 300), ack(3, 5))
local nodes = 0
for i = 1, 12 do nodes = nodes + count(tree(12)) end
print("tree", nodes)

-- Sorting with a Lua comparator: C calls back into Lua for every comparison.
local t = {}
local seed = 42
for i = 1, 120000 do seed = (seed * 1103515245 + 12345) % 2147483648; t[i] = seed end
table.sort(t, function(a, b) return a % 1000003 < b % 1000003 end)
print("sort", t[1], t[#t])

-- Strings: gsub with a function, concatenation, formatting.
local parts = {}
for i = 1, 60000 do parts[#parts + 1] = string.format("%d:%x", i, i * 7) end
local s = table.concat(parts, ",")
local sum = 0
s:gsub("(%d+):(%x+)", function(a, b) sum = sum + #a + #b end)
print("strings", #s, sum)

-- Metamethods: a vector type whose arithmetic goes through __add and __mul.
local V = {}
V.__index = V
V.__add = function(a, b) return setmetatable({ x = a.x + b.x, y = a.y + b.y }, V) end
V.__mul = function(a, k) return setmetatable({ x = a.x * k, y = a.y * k }, V) end
local acc = setmetatable({ x = 0, y = 0 }, V)
for i = 1, 300000 do acc = acc + setmetatable({ x = i % 7, y = i % 11 }, V) * 2 end
print("vectors", acc.x, acc.y)

-- Closures and coroutines.
local function gen(n)
  return coroutine.wrap(function() for i = 1, n do coroutine.yield(i) end end)
end
local total = 0
for v in gen(200000) do total = total + v end
print("coroutines", total)
