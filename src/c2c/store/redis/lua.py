"""The Lua scripts behind `RedisStore`: each write step is one atomic script run.

Redis runs a script without interleaving other commands, so a put (check
parents, adopt the uploaded chunks, assign the version, mark the previous head
stale, record edges) is all-or-nothing.

Every script names every key it touches in ``KEYS``; none builds a key name.
The client reads what it needs to name them first (the stream head, a commit's
parents, a walk's next dependents), and the script checks that what it was told
still holds, answering ``-3`` ("read again") when it does not. All keys of a
domain share the hash tag ``{<domain>}``, so on Redis Cluster every script runs
on one slot.

Invalidation walks the dependents in bounded steps, not in one script: marking
a commit stale pushes it on the walk list ``P walk:<root>``; each ``STEP`` run
marks at most a batch of the listed commits' fresh children (which the client
read with SSCAN) and lists them in turn. Between steps a put may add a child
under a commit of the walk; that is safe because a put checks its parents in
the same script that records the edge: under a parent already marked, the child
is born stale; under one not yet marked, it is in the parent's ``kids`` set
before the walk reads it. The walk below a superseded head spares the version
that superseded it, which may be built on the old one (or on its dependents)
and is still the new truth. A walk carries a lease in ``P walks`` that each step
renews; writes report walks whose lease ran out (their walker died), and the
client finishes them.

Key layout under the domain prefix ``P = "c2c:{<domain>}:"``::

    P c:<id>            hash    stream version parents blob size created summary seq format nchunks
                                chunks (JSON [[digest, size, key], ...], c2c.store.manifest)
                                [stale_root stale_cause stale_reason stale_chain stale_at] [superseded_by]
    P head:<id>         string  the artifact's head (format 2)
    P chunk:<digest>    string  one chunk's bytes, shared by every commit of the domain that lists it
    P refs              hash    digest -> how many times the domain's commits list that chunk
    P usage             hash    commits, logical (bytes of their artifacts), stored (chunks and heads), chunks
    P quota             string  the domain's byte quota (absent: none)
    P retention         hash    stream ('' for the domain's default) -> JSON {"keep_last": N, "ttl_s": T}
    P layout            string  "2": the domain's commits are kept as chunks (older layouts migrate on open)
    P kids:<id>         set     ids of the commits that list <id> as a parent
    P s:<stream>        zset    id -> version
    P all               zset    id -> global commit order (seq)
    P ids               zset    id -> 0, for prefix lookups (ZRANGEBYLEX)
    P streams           set     stream names
    P seq               counter
    P up:<token>:<i>    string  chunk i of a put in progress (expires on its own)
    P events            stream  one entry per commit marked stale
    P walk:<root>       list    the invalidation walk below <root>: JSON [id, chain, sscan cursor, spared id]
                                per commit marked but whose children are not all seen yet
    P walks             zset    root -> lease deadline (unix s) of each walk in progress
    P granted           hash    id -> the domain that shared its commit <id> with this one (Store.grant)

A domain's keys never name another domain's commits, except ``granted``, a pointer
the reader checks against the owner's signed share list before reading anything.
Stream identity was (domain, stream) from the first layout, so Redis stores need no
migration for it. Layout 1 kept each commit's artifact as ``P blob:<sha>:<i>`` pieces;
``MIGRATE`` turns them into format-1 chunks, one commit at a time.

Every script takes ``ARGV[1] = max events kept`` and ``ARGV[2] = walk lease (s)``.
"""

COMMON = r"""
local MAXEV = ARGV[1]
local LEASE = tonumber(ARGV[2])
local function now_str()
  local t = redis.call('TIME')
  return string.format('%s.%06d', t[1], tonumber(t[2]))
end
local function is_stale(ck) return redis.call('HEXISTS', ck, 'stale_reason') == 1 end
local function hops_reason(root, cause, hops)
  local s = 's'
  if hops == 1 then s = '' end
  return 'built on stale ' .. string.sub(root, 1, 12) .. ' (' .. hops .. ' hop' .. s .. ' up): ' .. cause
end
-- mark the commit whose hash is ck stale, and append its event to the stream ek
local function mark(ck, ek, id, root, cause, reason, chain, now, out)
  local cj = cjson.encode(chain)
  redis.call('HSET', ck, 'stale_root', root, 'stale_cause', cause, 'stale_reason', reason,
             'stale_chain', cj, 'stale_at', now)
  local eid = redis.call('XADD', ek, 'MAXLEN', '~', MAXEV, '*', 'commit', id, 'root', root,
                         'reason', reason, 'chain', cj, 'at', now)
  out[#out + 1] = {eid, id, root, reason, cj, now}
end
local function int(x)  -- an integer argument: never '1e+15', never '-0' (Redis refuses both)
  if x == 0 then return '0' end
  return string.format('%.0f', x)
end
local function renew(wsk, root)
  redis.call('ZADD', wsk, tonumber(redis.call('TIME')[1]) + LEASE, root)
end
-- start the walk below root (just marked); spare: a child the walk must leave fresh ('' for none)
local function begin_walk(wk, wsk, root, spare)
  redis.call('RPUSH', wk, cjson.encode({root, {root}, '0', spare}))
  renew(wsk, root)
end
-- roots of walks whose lease ran out: their walker is gone, someone must finish them
local function abandoned(wsk)
  return redis.call('ZRANGEBYSCORE', wsk, '-inf', redis.call('TIME')[1], 'LIMIT', 0, 8)
end
"""

# KEYS: c:<id> s:<stream> seq all ids streams events walks [c:<top> walk:<top>] (c:<p> kids:<p>)...
#       refs usage quota head:<id> chunk:<d_1..k> up:<token>:<i_1..k>   (c:<top> walk:<top> only when the stream
#       has a head; d_j the commit's distinct chunk digests, i_j the chunk index each was uploaded under)
# ARGV: MAXEV, LEASE, id, stream, blob, size, format, parents_json, summary_json, top (the head read, '' if none),
#       chunks_json, head, distinct_json ([[size, uses], ...] per d_j)
# -> {0} exists | {-1, parent} missing parent | {-2, j} chunk d_j neither stored nor uploaded (collected meanwhile)
#    | {-3, head} the head moved: retry | {-4, stored, quota, adding} over quota
#    | {1, version, created, events, walk root ('' if none), abandoned walk roots}
PUT = COMMON + r"""
local id, stream, blob, top = ARGV[3], ARGV[4], ARGV[5], ARGV[10]
local parents = cjson.decode(ARGV[8])
local distinct = cjson.decode(ARGV[13])
local k = #distinct
local ck, sk, seqk, allk, idsk, streamsk, ek, wsk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6],
                                                    KEYS[7], KEYS[8]
local at = 9
local ctop, wtop
if top ~= '' then ctop, wtop, at = KEYS[9], KEYS[10], 11 end
local rk = at + 2 * #parents   -- KEYS[at + 2(i-1)] = c:<parent i>, the next one kids:<parent i>
local uk_usage, qk, hk = rk + 1, rk + 2, rk + 3
local cb, ub = rk + 3, rk + 3 + k   -- KEYS[cb + j] = chunk:<d_j>, KEYS[ub + j] = its upload key
if #KEYS ~= ub + k then return redis.error_reply('c2c PUT: ' .. #KEYS .. ' keys for ' .. k .. ' chunks') end
local function drop_upload() for j = 1, k do redis.call('DEL', KEYS[ub + j]) end end
if redis.call('EXISTS', ck) == 1 then drop_upload() return {0} end
local head = redis.call('ZREVRANGE', sk, 0, 0, 'WITHSCORES')
if (head[1] or '') ~= top then return {-3, head[1] or ''} end
local inherited = nil
for i, p in ipairs(parents) do
  local s = redis.call('HMGET', KEYS[at + 2 * (i - 1)], 'version', 'stale_root', 'stale_cause', 'stale_chain')
  if not s[1] then drop_upload() return {-1, p} end
  if inherited == nil and s[2] then inherited = s end
end
local adding, fresh, have = string.len(ARGV[12]), 0, {}
for j = 1, k do
  local d = string.sub(KEYS[cb + j], -64)
  have[j] = redis.call('HEXISTS', KEYS[rk], d) == 1
  if not have[j] then
    if redis.call('EXISTS', KEYS[ub + j]) == 0 then drop_upload() return {-2, j - 1} end
    adding = adding + tonumber(distinct[j][1])
    fresh = fresh + 1
  end
end
local quota = redis.call('GET', KEYS[qk])
local stored = tonumber(redis.call('HGET', KEYS[uk_usage], 'stored') or '0')
if quota and stored + adding > tonumber(quota) then drop_upload() return {-4, int(stored), quota, int(adding)} end
for j = 1, k do
  local d = string.sub(KEYS[cb + j], -64)
  if have[j] then
    redis.call('HINCRBY', KEYS[rk], d, distinct[j][2])
    redis.call('DEL', KEYS[ub + j])
  else
    redis.call('RENAME', KEYS[ub + j], KEYS[cb + j])
    redis.call('PERSIST', KEYS[cb + j])
    redis.call('HSET', KEYS[rk], d, distinct[j][2])
  end
end
if string.len(ARGV[12]) > 0 then redis.call('SET', KEYS[hk], ARGV[12]) end
redis.call('HINCRBY', KEYS[uk_usage], 'commits', 1)
redis.call('HINCRBY', KEYS[uk_usage], 'logical', ARGV[6])
redis.call('HINCRBY', KEYS[uk_usage], 'stored', int(adding))
redis.call('HINCRBY', KEYS[uk_usage], 'chunks', fresh)
local now = now_str()
local version = 1
local out = {}
local walk = ''
if top ~= '' then
  version = tonumber(head[2]) + 1
  redis.call('HSET', ctop, 'superseded_by', id)
  if not is_stale(ctop) then
    local cause = 'superseded by ' .. string.sub(id, 1, 12) .. ' (stream ' .. stream .. ' v' .. version .. ')'
    mark(ctop, ek, top, top, cause, cause, {top}, now, out)
    begin_walk(wtop, wsk, top, id)  -- the new version is the new truth, even when built on the old
    walk = top
  end
end
local seq = redis.call('INCR', seqk)
local nchunks = #cjson.decode(ARGV[11])
redis.call('HSET', ck, 'stream', stream, 'version', version, 'parents', ARGV[8], 'blob', blob,
           'size', ARGV[6], 'format', ARGV[7], 'nchunks', nchunks, 'chunks', ARGV[11], 'created', now,
           'summary', ARGV[9], 'seq', seq)
for i = 1, #parents do redis.call('SADD', KEYS[at + 2 * (i - 1) + 1], id) end
if inherited then
  local chain = cjson.decode(inherited[4])
  chain[#chain + 1] = id
  mark(ck, ek, id, inherited[2], inherited[3], hops_reason(inherited[2], inherited[3], #chain - 1), chain, now,
       out)
end
redis.call('ZADD', sk, version, id)
redis.call('ZADD', allk, seq, id)
redis.call('ZADD', idsk, 0, id)
redis.call('SADD', streamsk, stream)
return {1, version, now, out, walk, abandoned(wsk)}
"""

# KEYS: c:<id> events walks walk:<id>    ARGV: MAXEV, LEASE, id, cause
# -> {-1} unknown | {marked 0/1, events, walk:<id> exists 0/1, abandoned walk roots}
INVALIDATE = COMMON + r"""
local ck, ek, wsk, wk = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[3]
if redis.call('HEXISTS', ck, 'stream') == 0 then return {-1} end
if is_stale(ck) then return {0, {}, redis.call('EXISTS', wk), abandoned(wsk)} end
local out = {}
mark(ck, ek, id, id, ARGV[4], ARGV[4], {id}, now_str(), out)
begin_walk(wk, wsk, id, '')
return {1, out, 1, abandoned(wsk)}
"""

# One bounded step of the walk below root: check that the walk list still starts with the nverify entries
# the client read, mark the fresh ones among the children it names, list those, pop npop entries and, if
# given, replace the (then) first entry by newhead (the same commit, its SSCAN further on).
# KEYS: walk:<root> walks events c:<root> c:<kid>...
# ARGV: MAXEV, LEASE, root, nverify, npop, newhead ('' for none), entry 1..nverify, then per kid: id, entry index
# -> {-3} the list changed: read again | {1, events, entries left}
STEP = COMMON + r"""
local wk, wsk, ek, crk = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local root, nv, np, newhead = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local nk = (#ARGV - 6 - nv) / 2
if #KEYS ~= 4 + nk or np > nv or (newhead ~= '' and np >= nv) then
  return redis.error_reply('c2c STEP: inconsistent arguments')
end
local entries = {}
if nv > 0 then
  local head = redis.call('LRANGE', wk, 0, nv - 1)
  if #head ~= nv then return {-3} end
  for i = 1, nv do
    if head[i] ~= ARGV[6 + i] then return {-3} end
    entries[i] = cjson.decode(head[i])
  end
end
local cause = redis.call('HGET', crk, 'stale_cause') or ''
local now = now_str()
local out, listed = {}, {}
for j = 1, nk do
  local kid, e = ARGV[6 + nv + 2 * j - 1], entries[tonumber(ARGV[6 + nv + 2 * j])]
  local kk = KEYS[4 + j]
  -- skip the spared child, and children deleted (gc) or marked since the client read them
  if kid ~= e[4] and redis.call('HEXISTS', kk, 'stream') == 1 and not is_stale(kk) then
    local chain = {}
    for i, v in ipairs(e[2]) do chain[i] = v end
    chain[#chain + 1] = kid
    mark(kk, ek, kid, root, cause, hops_reason(root, cause, #chain - 1), chain, now, out)
    listed[#listed + 1] = cjson.encode({kid, chain, '0', e[4]})
  end
end
if np > 0 then redis.call('LTRIM', wk, np, -1) end
if newhead ~= '' then redis.call('LSET', wk, 0, newhead) end
if #listed > 0 then redis.call('RPUSH', wk, unpack(listed)) end
local left = redis.call('LLEN', wk)
if left == 0 then redis.call('ZREM', wsk, root) else renew(wsk, root) end
return {1, out, left}
"""

# KEYS: c:<id> kids:<id> s:<stream> streams all ids (kids:<p>)... refs usage head:<id> chunk:<d_1..k>
# ARGV: MAXEV, LEASE, id, stream, blob, parents_json, uses_json ([uses per d_j]): the commit's fields as the
#       client read them
# -> 1 removed | 0 unknown or has dependents | -3 the fields changed (deleted and put again): read again
DELETE_LEAF = COMMON + r"""
local ck, kk, sk, streamsk, allk, idsk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id = ARGV[3]
local h = redis.call('HMGET', ck, 'stream', 'blob', 'parents', 'size')
if not h[1] then return 0 end
if h[1] ~= ARGV[4] or h[2] ~= ARGV[5] or h[3] ~= ARGV[6] then return -3 end
local parents = cjson.decode(h[3])
local uses = cjson.decode(ARGV[7])
local rk = 6 + #parents + 1
local usk, hk = rk + 1, rk + 2
if #KEYS ~= rk + 2 + #uses then return redis.error_reply('c2c DELETE_LEAF: wrong key count') end
if redis.call('SCARD', kk) > 0 then return 0 end
for i = 1, #parents do redis.call('SREM', KEYS[6 + i], id) end
local released, freed = redis.call('STRLEN', KEYS[hk]), 0
redis.call('DEL', KEYS[hk])
for j = 1, #uses do
  local key = KEYS[hk + j]
  local d = string.sub(key, -64)
  local left = redis.call('HINCRBY', KEYS[rk], d, -uses[j])
  if left <= 0 then
    released = released + redis.call('STRLEN', key)
    redis.call('DEL', key)
    redis.call('HDEL', KEYS[rk], d)
    freed = freed + 1
  end
end
redis.call('HINCRBY', KEYS[usk], 'commits', -1)
redis.call('HINCRBY', KEYS[usk], 'logical', '-' .. h[4])
redis.call('HINCRBY', KEYS[usk], 'stored', int(-released))
redis.call('HINCRBY', KEYS[usk], 'chunks', int(-freed))
redis.call('DEL', ck, kk)
redis.call('ZREM', sk, id)
if redis.call('ZCARD', sk) == 0 then redis.call('SREM', streamsk, h[1]) end
redis.call('ZREM', allk, id)
redis.call('ZREM', idsk, id)
return 1
"""

# Layout 1 -> 2, one commit: its blob pieces become format-1 chunks (digests hashed by the client).
# KEYS: c:<id> refs usage blob:<sha>:0..n-1 chunk:<d_0..n-1>
# ARGV: MAXEV, LEASE, old blob, n, chunks_json, manifest digest
# -> 1 migrated | 0 already | -3 the commit changed: read again
MIGRATE = COMMON + r"""
local ck, rk, usk = KEYS[1], KEYS[2], KEYS[3]
local n = tonumber(ARGV[4])
if #KEYS ~= 3 + 2 * n then return redis.error_reply('c2c MIGRATE: wrong key count') end
local h = redis.call('HMGET', ck, 'format', 'blob', 'size')
if not h[2] then return 0 end
if h[1] then return 0 end
if h[2] ~= ARGV[3] then return -3 end
local pieces = cjson.decode(ARGV[5])
local stored, fresh = 0, 0
for i = 1, n do
  local old, new = KEYS[3 + i], KEYS[3 + n + i]
  local d = string.sub(new, -64)
  if redis.call('HEXISTS', rk, d) == 1 then
    redis.call('DEL', old)
    redis.call('HINCRBY', rk, d, 1)
  elseif redis.call('EXISTS', old) == 1 then
    redis.call('RENAME', old, new)
    redis.call('HSET', rk, d, 1)
    stored = stored + tonumber(pieces[i][2])
    fresh = fresh + 1
  end
end
redis.call('HSET', ck, 'format', 1, 'nchunks', #pieces, 'chunks', ARGV[5], 'blob', ARGV[6])
redis.call('HINCRBY', usk, 'commits', 1)
redis.call('HINCRBY', usk, 'logical', h[3])
redis.call('HINCRBY', usk, 'stored', int(stored))
redis.call('HINCRBY', usk, 'chunks', fresh)
return 1
"""
