"""The Lua scripts behind `RedisStore`: each write is one atomic script run.

Redis runs a script without interleaving other commands, so a put (check
parents, adopt the uploaded chunks, assign the version, supersede the previous
head, record edges) and an invalidation (breadth-first walk down the dependents,
marking each and appending an event) are all-or-nothing, and a put can never
slip a new child under a commit while it is being invalidated.

Key layout under the domain prefix ``P = "c2c:<domain>:"``::

    P c:<id>            hash    stream version parents blob size chunks created summary seq
                                [stale_root stale_cause stale_reason stale_chain stale_at] [superseded_by]
    P kids:<id>         set     ids of the commits that list <id> as a parent
    P s:<stream>        zset    id -> version
    P all               zset    id -> global commit order (seq)
    P ids               zset    id -> 0, for prefix lookups (ZRANGEBYLEX)
    P streams           set     stream names
    P seq               counter
    P blob:<sha>:<i>    string  chunk i of a blob
    P up:<token>:<i>    string  chunk i of an upload in progress (expires on its own)
    P events            stream  one entry per commit marked stale

Every script takes ``ARGV[1] = P`` and ``ARGV[2] = max events kept``.
"""

COMMON = r"""
local P = ARGV[1]
local MAXEV = ARGV[2]
local function ckey(id) return P .. 'c:' .. id end
local function now_str()
  local t = redis.call('TIME')
  return string.format('%s.%06d', t[1], tonumber(t[2]))
end
local function is_stale(id) return redis.call('HEXISTS', ckey(id), 'stale_reason') == 1 end
local function hops_reason(root, cause, hops)
  local s = 's'
  if hops == 1 then s = '' end
  return 'built on stale ' .. string.sub(root, 1, 12) .. ' (' .. hops .. ' hop' .. s .. ' up): ' .. cause
end
local function mark(id, root, cause, reason, chain, now, out)
  local cj = cjson.encode(chain)
  redis.call('HSET', ckey(id), 'stale_root', root, 'stale_cause', cause, 'stale_reason', reason,
             'stale_chain', cj, 'stale_at', now)
  local eid = redis.call('XADD', P .. 'events', 'MAXLEN', '~', MAXEV, '*', 'commit', id, 'root', root,
                         'reason', reason, 'chain', cj, 'at', now)
  out[#out + 1] = {eid, id, root, reason, cj, now}
end
local function invalidate(root, cause, now, out)
  if is_stale(root) then return end
  mark(root, root, cause, cause, {root}, now, out)
  local queue = {{root, {root}}}
  local head = 1
  while head <= #queue do
    local node, chain = queue[head][1], queue[head][2]
    head = head + 1
    for _, kid in ipairs(redis.call('SMEMBERS', P .. 'kids:' .. node)) do
      if not is_stale(kid) then
        local kchain = {}
        for i, v in ipairs(chain) do kchain[i] = v end
        kchain[#kchain + 1] = kid
        mark(kid, root, cause, hops_reason(root, cause, #kchain - 1), kchain, now, out)
        queue[#queue + 1] = {kid, kchain}
      end
    end
  end
end
"""

# ARGV: P, MAXEV, id, stream, blob, size, nchunks, parents_json, summary_json, upload_token
# -> {0} exists | {-1, parent} missing parent | {-2} upload incomplete | {1, version, created, events}
PUT = COMMON + r"""
local id, stream, blob = ARGV[3], ARGV[4], ARGV[5]
local n = tonumber(ARGV[7])
local up = P .. 'up:' .. ARGV[10]
local bk = P .. 'blob:' .. blob
local function drop_upload() for i = 0, n - 1 do redis.call('DEL', up .. ':' .. i) end end
if redis.call('EXISTS', ckey(id)) == 1 then drop_upload() return {0} end
local parents = cjson.decode(ARGV[8])
local inherited = nil
for _, p in ipairs(parents) do
  local s = redis.call('HMGET', ckey(p), 'version', 'stale_root', 'stale_cause', 'stale_chain')
  if not s[1] then drop_upload() return {-1, p} end
  if inherited == nil and s[2] then inherited = s end
end
if redis.call('EXISTS', bk .. ':0') == 1 then
  drop_upload()
else
  for i = 0, n - 1 do
    if redis.call('EXISTS', up .. ':' .. i) == 0 then drop_upload() return {-2} end
  end
  for i = 0, n - 1 do
    redis.call('RENAME', up .. ':' .. i, bk .. ':' .. i)
    redis.call('PERSIST', bk .. ':' .. i)
  end
end
local now = now_str()
local sk = P .. 's:' .. stream
local top = redis.call('ZREVRANGE', sk, 0, 0, 'WITHSCORES')
local version = 1
local out = {}
if #top > 0 then
  version = tonumber(top[2]) + 1
  redis.call('HSET', ckey(top[1]), 'superseded_by', id)
  invalidate(top[1], 'superseded by ' .. string.sub(id, 1, 12) .. ' (stream ' .. stream .. ' v' .. version .. ')',
             now, out)
end
local seq = redis.call('INCR', P .. 'seq')
redis.call('HSET', ckey(id), 'stream', stream, 'version', version, 'parents', ARGV[8], 'blob', blob,
           'size', ARGV[6], 'chunks', n, 'created', now, 'summary', ARGV[9], 'seq', seq)
for _, p in ipairs(parents) do redis.call('SADD', P .. 'kids:' .. p, id) end
if inherited then
  local chain = cjson.decode(inherited[4])
  chain[#chain + 1] = id
  mark(id, inherited[2], inherited[3], hops_reason(inherited[2], inherited[3], #chain - 1), chain, now, out)
end
redis.call('ZADD', sk, version, id)
redis.call('ZADD', P .. 'all', seq, id)
redis.call('ZADD', P .. 'ids', 0, id)
redis.call('SADD', P .. 'streams', stream)
return {1, version, now, out}
"""

# ARGV: P, MAXEV, id, cause -> {-1} unknown | {1, events}
INVALIDATE = COMMON + r"""
local id = ARGV[3]
if redis.call('EXISTS', ckey(id)) == 0 then return {-1} end
local out = {}
invalidate(id, ARGV[4], now_str(), out)
return {1, out}
"""

# ARGV: P, MAXEV, id -> 1 removed | 0 unknown or has dependents
DELETE_LEAF = COMMON + r"""
local id = ARGV[3]
local h = redis.call('HMGET', ckey(id), 'stream', 'blob', 'chunks', 'parents')
if not h[1] then return 0 end
if redis.call('SCARD', P .. 'kids:' .. id) > 0 then return 0 end
for _, p in ipairs(cjson.decode(h[4])) do redis.call('SREM', P .. 'kids:' .. p, id) end
for i = 0, tonumber(h[3]) - 1 do redis.call('DEL', P .. 'blob:' .. h[2] .. ':' .. i) end
redis.call('DEL', ckey(id), P .. 'kids:' .. id)
redis.call('ZREM', P .. 's:' .. h[1], id)
if redis.call('ZCARD', P .. 's:' .. h[1]) == 0 then redis.call('SREM', P .. 'streams', h[1]) end
redis.call('ZREM', P .. 'all', id)
redis.call('ZREM', P .. 'ids', id)
return 1
"""
