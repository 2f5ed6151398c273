#!lua name=sluice
-- Sluice store semantics as Redis Functions (Redis >= 7). Loaded by sluice-redis with
-- FUNCTION LOAD REPLACE, followed by checkpoint.lua (one library, one chunk: that file uses the
-- helpers here); the Rust side (crates/sluice-redis/src/lib.rs) documents the layout.
--
-- Keys of bucket b under prefix P share the hash tag {P:b}, so one bucket lives in one slot:
--   {P:b}v:<k>  value: a string (Int as decimal, else a binary encoding) or a list of encodings
--   {P:b}m:<k>  meta hash: t (s|l: the value's form), q (version), o (owner), c (claimant),
--               d (timer deadline, 16 hex digits), w (who set the timer)
--   {P:b}s:<k>  subscribers (set of client ids)
--   {P:b}K      every entry key <k> of the bucket (for checkpoint, restore, cleanup)
--   {P:b}L      per-clock log: hash <logid> -> result encoding ('' = none)
--   {P:b}X      log index: lex zset of <logid> = hex16(clock) hex4(vertex) hex8(seq), followed
--               by '+' <k> when b:<k> keeps what the update found (so that ForgetClock drops it)
--   {P:b}T      TS vector: hash client -> clock (decimal), the highest clock logged per client
--   {P:b}Z      timers: lex zset of hex16(deadline) .. <k>
--   {P:b}N      packet time, hex16
--   {P:b}Q      version counter
--   {P:b}n:<c>  notifications for client c (list)
--   {P:b}b:<k>  what the tagged updates of <k> found before them, for a replayed packet's read
--               (docs/decisions.md, "A replayed packet reads what its first run read"): hash
--               <logid> -> n (absent) | v .. encoding | u (not kept); a few fields (the clocks
--               not yet forgotten), so a small hash, cheaper to add to than a sorted set
--   {P:b}F      fences: hash client -> the lowest epoch accepted from it (`sluice_fence`); written
--               in every bucket of a node at once, so one bucket tells for the whole node
--   {P:b}I      intents: hash client -> the tagged updates of the client's batch in progress, kept
--               while the batch spans several calls (nodes) so that a replacement can finish a
--               batch its failed predecessor left half applied (connection.rs, `IntentStep`)
-- Every function is called with no declared keys and touches only buckets the caller says are
-- on this node (flag allow-cross-slot-keys: a node may serve several buckets' slots).

local VERSION = '5'

local function enc_list(elems)
  local parts = { '\1L', struct.pack('>I4', #elems) }
  for i = 1, #elems do
    local e = elems[i]
    parts[#parts + 1] = struct.pack('>I4', #e)
    parts[#parts + 1] = e
  end
  return table.concat(parts)
end

local function is_int(enc)
  local c = string.byte(enc, 1)
  return c ~= nil and (c == 45 or (c >= 48 and c <= 57))
end

local KINDS = { F = 'float', E = 'endpoint', T = 'tuple', I = 'ints', L = 'list', B = 'bytes' }

local function kind_of(enc)
  if is_int(enc) then
    return 'int'
  end
  return KINDS[string.sub(enc, 2, 2)] or 'unknown'
end

-- Pushes a (possibly long) list of strings onto a Redis list in chunks (Lua's unpack limit).
local function push_all(key, elems)
  local n = #elems
  local i = 1
  while i <= n do
    local j = math.min(i + 999, n)
    redis.call('RPUSH', key, unpack(elems, i, j))
    i = j + 1
  end
end

local function del_all(cmd, key, members)
  local n = #members
  local i = 1
  while i <= n do
    local j = math.min(i + 999, n)
    redis.call(cmd, key, unpack(members, i, j))
    i = j + 1
  end
end

-- Reads a value form from the argument list: 'n' | 's' enc | 'l' count e1..en.
local function read_form(a, i)
  local f = a[i]
  if f == 's' then
    return { f = 's', s = a[i + 1] }, i + 2
  elseif f == 'l' then
    local n = tonumber(a[i + 1])
    local l = {}
    for j = 1, n do
      l[j] = a[i + 1 + j]
    end
    return { f = 'l', l = l }, i + 2 + n
  end
  return { f = 'n' }, i + 1
end

local function entry(h, k)
  return { h = h, k = k, v = h .. 'v:' .. k, m = h .. 'm:' .. k, s = h .. 's:' .. k }
end

-- The value's full encoding ('' when absent).
local function full_enc(e, t)
  if not t then
    return ''
  elseif t == 's' then
    return redis.call('GET', e.v) or ''
  end
  return enc_list(redis.call('LRANGE', e.v, 0, -1))
end

-- Writes `form` as the entry's value; `was` is the value's form before (its 't'), so that an
-- overwrite in the same form costs one call.
local function write_form(e, form, was)
  if form.f == 's' then
    redis.call('SET', e.v, form.s)
    if was ~= 's' then
      redis.call('HSET', e.m, 't', 's')
    end
  elseif form.f == 'l' then
    redis.call('DEL', e.v)
    push_all(e.v, form.l)
    if was ~= 'l' then
      redis.call('HSET', e.m, 't', 'l')
    end
  else
    redis.call('DEL', e.v)
    redis.call('HDEL', e.m, 't')
  end
end

-- Records a change of the value: a new version (for optimistic custom operations). `was` is the
-- value's form before the change: an entry that held a value is listed in K already (every
-- write of a form lists it, and only `cleanup` or a restore unlists it).
local function bump(e, was)
  redis.call('HSET', e.m, 'q', redis.call('INCR', e.h .. 'Q'))
  if not was then
    redis.call('SADD', e.h .. 'K', e.k)
  end
end

-- Drops the entry's metadata once it holds nothing (the embedded engine drops empty entries).
local function cleanup(e)
  local f = redis.call('HMGET', e.m, 't', 'o', 'c', 'd')
  if not f[1] and not f[2] and not f[3] and not f[4] and redis.call('SCARD', e.s) == 0 then
    redis.call('DEL', e.m, e.v)
    redis.call('SREM', e.h .. 'K', e.k)
  end
end

local function notify(h, to, note)
  redis.call('RPUSH', h .. 'n:' .. to, note)
end

local function notify_changed(e, client)
  local subs = redis.call('SMEMBERS', e.s)
  if #subs == 0 then
    return
  end
  local t = redis.call('HGET', e.m, 't')
  local note = 'C' .. e.k .. full_enc(e, t)
  for _, s in ipairs(subs) do
    if s ~= client then
      notify(e.h, s, note)
    end
  end
end

local function ts_vector(h)
  return redis.call('HGETALL', h .. 'T')
end

-- Logs the result of a tagged update; the TS vector keeps the client's last update applied, in
-- the order applied (clocks need not grow along a client's log: several roots, a restarted root,
-- replays). A duplicate changes neither. `kept`: the key whose b:<k> keeps what it found, if any.
local function log_applied(h, client, logid, clock, result, kept)
  if redis.call('HSET', h .. 'L', logid, result) == 1 then
    if kept then
      redis.call('ZADD', h .. 'X', 0, logid .. '+' .. kept)
    else
      redis.call('ZADD', h .. 'X', 0, logid)
    end
    redis.call('HSET', h .. 'T', client, clock)
  end
end

-- What a tagged update of entry e (value form t) keeps of the value before it, by the embedded
-- store's rules (`clock_log::Was::of`): nil for a global object's value (key `Unit`: no flow's),
-- 'u' for a value too large to keep (a list, bytes, a record of more than 8 integers: a replayed
-- read of it reads the value now), else 'n' (absent) or 'v' .. encoding.
local function before_of(e, t)
  if string.byte(e.k, 5) == 85 then
    return nil
  elseif not t then
    return 'n'
  elseif t == 'l' then
    return 'u'
  end
  local enc = redis.call('GET', e.v) or ''
  local kind = kind_of(enc)
  if kind == 'bytes' or kind == 'list' or (kind == 'ints' and #enc > 6 + 8 * 8) then
    return 'u'
  end
  return 'v' .. enc
end

local LOGID_LEN = 28

-- A replayed packet's read of k: the value before the first kept update of k at its log id
-- (clock, vertex, and the number the packet's next update gets) or later, of the same root (the
-- first 2 hex digits of a log id). A key's updates are all of its vertex, so text order is
-- (clock, number) order. Returns the encoding ('' = absent), or nil to read the value now.
local function as_of(h, k, logid)
  local root = string.sub(logid, 1, 2)
  local kv = redis.call('HGETALL', h .. 'b:' .. k)
  local first, kept = nil, nil
  for x = 1, #kv, 2 do
    local id = kv[x]
    if id >= logid and string.sub(id, 1, 2) == root and (not first or id < first) then
      first, kept = id, kv[x + 1]
    end
  end
  if not kept then
    return nil
  end
  local kind = string.sub(kept, 1, 1)
  if kind == 'n' then
    return ''
  elseif kind == 'v' then
    return string.sub(kept, 2)
  end
  return nil
end

-- Adds the decimal text d to an integer value; true if it did not overflow.
local function incrby(key, d)
  local r = redis.pcall('INCRBY', key, d)
  return not (type(r) == 'table' and r.err)
end

-- Undoes a successful incrby(key, d) (exact: the sum was in range).
local function undo_incr(key, d)
  if d == '-9223372036854775808' then
    redis.call('INCRBY', key, '9223372036854775807')
    redis.call('INCRBY', key, '1')
  elseif string.sub(d, 1, 1) == '-' then
    redis.call('INCRBY', key, string.sub(d, 2))
  elseif d ~= '0' then
    redis.call('INCRBY', key, '-' .. d)
  end
end

-- Executes one state operation (not Get) after the ownership check. Returns
-- ('o', result) | ('e', code, a, b) | ('f'): fall back to read-apply-write in the client.
local function state_update(e, code, a, i, t)
  if code == 'S' then
    local form = read_form(a, i)
    write_form(e, form, t)
    bump(e, t)
    return 'o', ''
  elseif code == 'D' then
    local r = full_enc(e, t)
    if t then
      redis.call('DEL', e.v)
      redis.call('HDEL', e.m, 't')
      bump(e, t)
    end
    return 'o', r
  elseif code == 'I' then
    local d = a[i]
    if not t then
      redis.call('SET', e.v, d)
      redis.call('HSET', e.m, 't', 's')
      bump(e, t)
      return 'o', d
    elseif t == 'l' then
      return 'e', 'wrong', 'incr', 'list'
    end
    local ok = redis.pcall('INCRBY', e.v, d)
    if type(ok) == 'table' and ok.err then
      local cur = redis.call('GET', e.v) or ''
      local kind = kind_of(cur)
      if kind == 'int' or kind == 'float' then
        -- i64 overflow (wrapping in Rust) or a float: exact arithmetic happens in the client.
        return 'f'
      end
      return 'e', 'wrong', 'incr', kind
    end
    bump(e, t)
    return 'o', redis.call('GET', e.v)
  elseif code == 'P' then
    if t == 's' then
      return 'e', 'wrong', 'push', kind_of(redis.call('GET', e.v) or '')
    end
    local n = redis.call('RPUSH', e.v, a[i])
    if not t then
      redis.call('HSET', e.m, 't', 'l')
    end
    bump(e, t)
    return 'o', tostring(n)
  elseif code == 'O' then
    if not t then
      return 'o', ''
    elseif t == 's' then
      return 'e', 'wrong', 'pop', kind_of(redis.call('GET', e.v) or '')
    end
    local x = redis.call('LPOP', e.v)
    if x then
      bump(e, t)
      return 'o', x
    end
    return 'o', ''
  elseif code == 'N' then
    if not t then
      return 'o', enc_list({})
    elseif t == 's' then
      return 'e', 'wrong', 'pop_n', kind_of(redis.call('GET', e.v) or '')
    end
    local n = tonumber(a[i])
    local xs = {}
    if n > 0 then
      xs = redis.call('LPOP', e.v, n) or {}
    end
    if #xs > 0 then
      bump(e, t)
    end
    return 'o', enc_list(xs)
  elseif code == 'C' then
    local expect, j = read_form(a, i)
    local new = read_form(a, j)
    local eq
    if expect.f == 'n' then
      eq = not t
    elseif expect.f == 's' then
      eq = (t == 's') and (redis.call('GET', e.v) == expect.s)
    else
      eq = false
      if t == 'l' and redis.call('LLEN', e.v) == #expect.l then
        local cur = redis.call('LRANGE', e.v, 0, -1)
        eq = true
        for x = 1, #cur do
          if cur[x] ~= expect.l[x] then
            eq = false
            break
          end
        end
      end
    end
    if eq then
      write_form(e, new, t)
      bump(e, t)
      return 'o', '1'
    end
    return 'o', full_enc(e, t)
  elseif code == 'J' then
    -- Several tagged increments: each applied unless its tag was logged before.
    local m = tonumber(a[i])
    local todo, flags = {}, {}
    for x = 1, m do
      local base = i + 1 + 3 * (x - 1)
      if redis.call('HEXISTS', e.h .. 'L', a[base]) == 1 then
        flags[x] = '1'
      else
        flags[x] = '0'
        todo[#todo + 1] = base
      end
    end
    if #todo == 0 then
      return 'o', ''
    end
    if t == 'l' then
      return 'e', 'wrong', 'incr', 'list'
    elseif t == 's' then
      local kind = kind_of(redis.call('GET', e.v) or '')
      if kind == 'float' then
        return 'f', table.concat(flags)
      elseif kind ~= 'int' then
        return 'e', 'wrong', 'incr', kind
      end
    end
    local results = {}
    for x, base in ipairs(todo) do
      if not incrby(e.v, a[base + 2]) then
        -- Overflow (wrapping in Rust): undo, and let the client apply them all exactly.
        for y = x - 1, 1, -1 do
          undo_incr(e.v, a[todo[y] + 2])
        end
        if not t then
          redis.call('DEL', e.v)
        end
        return 'f', table.concat(flags)
      end
      results[x] = redis.call('GET', e.v)
    end
    if not t then
      redis.call('HSET', e.m, 't', 's')
    end
    bump(e, t)
    for x, base in ipairs(todo) do
      log_applied(e.h, e.client, a[base], a[base + 1], results[x])
    end
    return 'o', ''
  elseif code == 'R' then
    return 'f'
  elseif code == 'E' then
    -- Record: the answer is the argument; the per-clock log keeps it for repeats.
    return 'o', a[i]
  elseif code == 'W' then
    local ver = a[i]
    local new, j = read_form(a, i + 1)
    -- '*': the owner's write of an update it applied itself (no condition).
    if ver ~= '*' then
      local q = redis.call('HGET', e.m, 'q') or '0'
      if q ~= ver then
        return 'f'
      end
    end
    write_form(e, new, t)
    bump(e, t)
    -- Tagged increments of an IncrMany applied here: logid, clock, result each.
    local m = tonumber(a[j + 1])
    for x = 1, m do
      local base = j + 2 + 3 * (x - 1)
      log_applied(e.h, e.client, a[base], a[base + 1], a[base + 2])
    end
    return 'o', a[j]
  end
  return 'e', 'protocol', 'unknown op ' .. tostring(code), ''
end

-- Executes one keyed operation; logid is the update's tag ('' = untagged). Returns
-- ('o', result, ts?) | ('o', result, nil, nil, true: what the update found is kept, see
-- before_of) | ('e', code, a, b) | ('f').
local function execute(h, client, k, code, a, i, logid)
  local e = entry(h, k)
  e.client = client
  local meta = redis.call('HMGET', e.m, 't', 'o', 'd')
  local t, o, armed = meta[1], meta[2], meta[3]
  if code == 'G' then
    local r = full_enc(e, t)
    if not o then
      return 'o', r, ts_vector(h)
    end
    return 'o', r
  elseif code == 'U' then
    redis.call('SADD', e.s, client)
    redis.call('SADD', h .. 'K', k)
    return 'o', full_enc(e, t), ts_vector(h)
  elseif code == 'u' then
    redis.call('SREM', e.s, client)
    cleanup(e)
    return 'o', ''
  elseif code == 'A' then
    if armed then
      redis.call('ZREM', h .. 'Z', armed .. k)
    end
    redis.call('HSET', e.m, 'd', a[i], 'w', client)
    redis.call('ZADD', h .. 'Z', 0, a[i] .. k)
    if not armed then
      -- An armed timer lists its entry in K already.
      redis.call('SADD', h .. 'K', k)
    end
    return 'o', ''
  elseif code == 'a' then
    if armed then
      redis.call('ZREM', h .. 'Z', armed .. k)
      redis.call('HDEL', e.m, 'd', 'w')
    end
    cleanup(e)
    return 'o', ''
  elseif code == 'x' then
    -- The caller's copy of the timer fired: expire it only if the store's is still that one.
    if armed ~= a[i] then
      return 'o', '0'
    end
    redis.call('ZREM', h .. 'Z', armed .. k)
    redis.call('HDEL', e.m, 'd', 'w')
    cleanup(e)
    return 'o', '1'
  elseif code == 'M' then
    if not o then
      redis.call('HSET', e.m, 'o', client)
      redis.call('SADD', h .. 'K', k)
      return 'o', '1'
    elseif o == client then
      return 'o', '1'
    end
    redis.call('HSET', e.m, 'c', client)
    return 'o', '0'
  elseif code == 'm' then
    if o == client then
      local c = redis.call('HGET', e.m, 'c')
      if c then
        redis.call('HSET', e.m, 'o', c)
        redis.call('HDEL', e.m, 'c')
        notify(h, c, 'H' .. k)
      else
        redis.call('HDEL', e.m, 'o')
      end
    end
    cleanup(e)
    return 'o', ''
  end
  -- State updates: only the owner (if any) may change a value.
  if o and o ~= client then
    return 'e', 'owned', o, ''
  end
  local kept = nil
  if logid ~= '' then
    kept = before_of(e, t)
  end
  local st, x, y, z = state_update(e, code, a, i, t)
  if st == 'o' then
    if kept then
      redis.call('HSET', e.h .. 'b:' .. k, logid, kept)
    end
    notify_changed(e, client)
    if code == 'D' or code == 'W' then
      cleanup(e)
    end
  elseif st == 'f' then
    local meta2 = redis.call('HMGET', e.m, 't', 'q')
    return 'f', full_enc(e, meta2[1]), meta2[2] or '0', x
  end
  return st, x, y, z, st == 'o' and kept ~= nil
end

-- Forgets the log entries with clocks in [lo, hi] (one root's clocks up to the one given).
local function forget(h, lo, hi)
  local ms = redis.call('ZRANGEBYLEX', h .. 'X', lo, hi)
  if #ms > 0 then
    local ids, kept = {}, {}
    for x, m in ipairs(ms) do
      local id = string.sub(m, 1, LOGID_LEN)
      ids[x] = id
      if #m > LOGID_LEN then
        local k = string.sub(m, LOGID_LEN + 2)
        local of_k = kept[k]
        if not of_k then
          of_k = {}
          kept[k] = of_k
        end
        of_k[#of_k + 1] = id
      end
    end
    del_all('HDEL', h .. 'L', ids)
    for k, of_k in pairs(kept) do
      del_all('HDEL', h .. 'b:' .. k, of_k)
    end
    redis.call('ZREMRANGEBYLEX', h .. 'X', lo, hi)
  end
end

local function advance(h, thex, bound)
  local now = redis.call('GET', h .. 'N') or '0000000000000000'
  if thex <= now then
    return
  end
  redis.call('SET', h .. 'N', thex)
  local due = redis.call('ZRANGEBYLEX', h .. 'Z', '-', bound)
  for _, m in ipairs(due) do
    redis.call('ZREM', h .. 'Z', m)
    local d = string.sub(m, 1, 16)
    local e = entry(h, string.sub(m, 17))
    local f = redis.call('HMGET', e.m, 'd', 'w', 'o')
    if f[1] == d then
      -- It stays armed until its owner cancels it, in the batch that carries its expiry's
      -- updates: an owner that fails first leaves it for its replacement to adopt.
      notify(h, f[3] or f[2], 'T' .. e.k)
    end
  end
end

-- ARGV: prefix, client, epoch ('': a connection acting for the client, never fenced), probe
-- (1: touch every bucket first), drain (1: return this client's notifications), intent mode
-- ('' | 'S': store the blob as the client's intent | 'C': clear it), intent bucket, intent
-- blob, nb, bucket ids..., then operations, each:
--   code, bucket, key, reply (1|0), logid ('' = untagged), clock, arguments...
-- Returns { results, notes }; a result is { index, 'o', result [, ts] } | { index, 'r', result }
-- | { index, 'n' } (code 'L', the logged result of the tag's update: none logged)
-- | { index, 'e', code, a, b } | { index, 'f', encoding, version [, logged flags] }
-- (execution stops there: the client applies the operation and sends a conditional write).
-- A fenced client's call fails with SLUICE_FENCED <lowest epoch>, before it changes anything.
local function exec(_keys, a)
  local P, client, epoch = a[1], a[2], a[3]
  local probe, drain = a[4] == '1', a[5] == '1'
  local nb = tonumber(a[9])
  local tags = {}
  for j = 1, nb do
    tags[j] = '{' .. P .. ':' .. a[9 + j] .. '}'
  end
  if epoch ~= '' then
    -- Every bucket of a node is fenced in one call: the first of this call's (or the
    -- intent's, when it names none) tells for them all.
    local h = tags[1] or ('{' .. P .. ':' .. a[7] .. '}')
    local lowest = redis.call('HGET', h .. 'F', client)
    if lowest and tonumber(lowest) > tonumber(epoch) then
      return redis.error_reply('SLUICE_FENCED ' .. lowest)
    end
  end
  if probe then
    -- Fail (on a bucket moved to another node) before changing anything.
    for j = 1, nb do
      redis.call('EXISTS', tags[j] .. 'N')
    end
  end
  -- The intent is stored in the same atomic call as the first of the batch's operations.
  if a[6] == 'S' then
    redis.call('HSET', '{' .. P .. ':' .. a[7] .. '}I', client, a[8])
  elseif a[6] == 'C' then
    redis.call('HDEL', '{' .. P .. ':' .. a[7] .. '}I', client)
  end
  local results = {}
  local i = 10 + nb
  local idx = 0
  local n = #a
  while i <= n do
    idx = idx + 1
    local code, b, k, reply, logid, clock = a[i], a[i + 1], a[i + 2], a[i + 3] == '1', a[i + 4], a[i + 5]
    local args = i + 6
    -- Skip over this operation's arguments to find the next one.
    local nargs = 0
    if code == 'S' then
      local _, j = read_form(a, args)
      nargs = j - args
    elseif code == 'W' then
      local _, j = read_form(a, args + 1)
      nargs = j + 2 + 3 * tonumber(a[j + 1]) - args
    elseif code == 'J' then
      nargs = 1 + 3 * tonumber(a[args])
    elseif code == 'C' then
      local _, j = read_form(a, args)
      local _, j2 = read_form(a, j)
      nargs = j2 - args
    elseif code == 'I' or code == 'P' or code == 'N' or code == 'A' or code == 'x' or code == 'E' then
      nargs = 1
    elseif code == 'V' or code == 'F' then
      nargs = 2
    end
    local nexti = args + nargs
    if code == 'F' then
      for j = 1, nb do
        forget(tags[j], a[args], a[args + 1])
      end
      if reply then
        results[#results + 1] = { idx, 'o', '' }
      end
    elseif code == 'V' then
      for j = 1, nb do
        advance(tags[j], a[args], a[args + 1])
      end
      if reply then
        results[#results + 1] = { idx, 'o', '' }
      end
    else
      local h = '{' .. P .. ':' .. b .. '}'
      local logged = false
      if logid ~= '' and code == 'G' then
        -- A replayed packet's read: the value as its first run found it, where kept.
        local was = as_of(h, k, logid)
        if was then
          if reply then
            results[#results + 1] = { idx, 'o', was }
          end
          logid = ''
          code = nil
        end
      elseif logid ~= '' then
        logged = redis.call('HGET', h .. 'L', logid)
      end
      if not code then
        -- Answered above.
      elseif logged then
        if reply then
          results[#results + 1] = { idx, 'r', logged }
        end
      elseif code == 'L' then
        -- The logged result of an update (an emulated packet's): none, and nothing applied.
        if reply then
          results[#results + 1] = { idx, 'n' }
        end
      else
        local st, x, y, z, kept = execute(h, client, k, code, a, args, logid)
        if st == 'o' then
          -- A tagged read only consults the log: logging it would make a later update with the
          -- same tag look like a duplicate, and it executed no update for the TS vector.
          if logid ~= '' and code ~= 'G' then
            log_applied(h, client, logid, clock, x, kept and k or nil)
          end
          if reply then
            if y then
              results[#results + 1] = { idx, 'o', x, y }
            else
              results[#results + 1] = { idx, 'o', x }
            end
          end
        elseif st == 'e' then
          results[#results + 1] = { idx, 'e', x, y, z }
        else
          results[#results + 1] = { idx, 'f', x, y, z }
          break
        end
      end
    end
    i = nexti
  end
  local notes = {}
  if drain then
    for j = 1, nb do
      local key = tags[j] .. 'n:' .. client
      local xs = redis.call('LRANGE', key, 0, -1)
      if #xs > 0 then
        redis.call('DEL', key)
        for _, x in ipairs(xs) do
          notes[#notes + 1] = x
        end
      end
    end
  end
  return { results, notes }
end

-- ARGV: prefix, nb, bucket ids... (every bucket this node serves), client, epoch. Fences the
-- client below epoch in each bucket (a lower epoch than one already there changes nothing).
local function fence(_keys, a)
  local P, nb = a[1], tonumber(a[2])
  local client, epoch = a[3 + nb], tonumber(a[4 + nb])
  for j = 1, nb do
    local h = '{' .. P .. ':' .. a[2 + j] .. '}F'
    local lowest = redis.call('HGET', h, client)
    if not lowest or tonumber(lowest) < epoch then
      redis.call('HSET', h, client, epoch)
    end
  end
  return 'OK'
end

local function version(_keys, _a)
  return VERSION
end

redis.register_function { function_name = 'sluice_exec', callback = exec, flags = { 'allow-cross-slot-keys' } }
redis.register_function { function_name = 'sluice_fence', callback = fence, flags = { 'allow-cross-slot-keys' } }
redis.register_function { function_name = 'sluice_version', callback = version, flags = { 'no-writes' } }
