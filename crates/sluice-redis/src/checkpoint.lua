-- Checkpoints of the Sluice store (sluice_dump, sluice_restore): the second part of the
-- `sluice` Redis Functions library, loaded as one chunk after sluice.lua, whose layout and
-- helpers (entry, full_enc, read_form, write_form, bump, ts_vector, LOGID_LEN) it uses.

-- ARGV: prefix, nb, bucket ids... Returns { values, ts, timers, log }: values = flat key,
-- encoding pairs; ts = flat client, clock pairs of every bucket (the caller keeps the maximum
-- per client); timers = flat key, deadline (hex16), recipient triples (the owner if the key is
-- claimed, else the client that armed it: who would be told now); log = flat bucket, logid,
-- result, key, found quintuples (the per-clock log; key and found '' unless b:<key> keeps what
-- the update found).
local function dump(_keys, a)
  local P, nb = a[1], tonumber(a[2])
  local values, ts, timers, log = {}, {}, {}, {}
  for j = 1, nb do
    local h = '{' .. P .. ':' .. a[2 + j] .. '}'
    local kv = redis.call('HGETALL', h .. 'L')
    local key_of = {}
    for _, m in ipairs(redis.call('ZRANGE', h .. 'X', 0, -1)) do
      if #m > LOGID_LEN then
        key_of[string.sub(m, 1, LOGID_LEN)] = string.sub(m, LOGID_LEN + 2)
      end
    end
    for x = 1, #kv, 2 do
      local k = key_of[kv[x]]
      local found = k and redis.call('HGET', h .. 'b:' .. k, kv[x])
      log[#log + 1] = a[2 + j]
      log[#log + 1] = kv[x]
      log[#log + 1] = kv[x + 1]
      log[#log + 1] = found and k or ''
      log[#log + 1] = found or ''
    end
    -- One metadata read per entry serves both the value and its timer (every entry with a
    -- timer is in K): checkpoints run every few hundred milliseconds on large buckets.
    for _, k in ipairs(redis.call('SMEMBERS', h .. 'K')) do
      local e = entry(h, k)
      local f = redis.call('HMGET', e.m, 't', 'd', 'w', 'o')
      if f[1] then
        values[#values + 1] = k
        values[#values + 1] = full_enc(e, f[1])
      end
      if f[2] then
        timers[#timers + 1] = k
        timers[#timers + 1] = f[2]
        timers[#timers + 1] = f[4] or f[3]
      end
    end
    for _, x in ipairs(ts_vector(h)) do
      ts[#ts + 1] = x
    end
  end
  return { values, ts, timers, log }
end

-- ARGV: prefix, nb, bucket ids..., nts, client, clock pairs..., ntimers, timers: bucket, key,
-- deadline (hex16), client..., nlog, log: bucket, logid, result, key, found ('' '': none)...,
-- then values: bucket, key, form.
-- Clears entries, logs, timers and intents of the buckets (not their time or notifications), sets the
-- TS vector of every bucket, re-arms the timers, restores the per-clock log and writes the
-- values.
local function restore(_keys, a)
  local P, nb = a[1], tonumber(a[2])
  local i = 3 + nb
  local nts = tonumber(a[i])
  local tsargs = {}
  for x = 1, 2 * nts do
    tsargs[x] = a[i + x]
  end
  i = i + 1 + 2 * nts
  local ntimers = tonumber(a[i])
  local tstart = i + 1
  i = tstart + 4 * ntimers
  local nlog = tonumber(a[i])
  local lstart = i + 1
  i = lstart + 5 * nlog
  for j = 1, nb do
    local h = '{' .. P .. ':' .. a[2 + j] .. '}'
    for _, k in ipairs(redis.call('SMEMBERS', h .. 'K')) do
      local e = entry(h, k)
      redis.call('DEL', e.v, e.m, e.s)
    end
    -- A restored store keeps no earlier values (as the embedded one).
    for _, m in ipairs(redis.call('ZRANGE', h .. 'X', 0, -1)) do
      if #m > LOGID_LEN then
        redis.call('DEL', h .. 'b:' .. string.sub(m, LOGID_LEN + 2))
      end
    end
    redis.call('DEL', h .. 'K', h .. 'L', h .. 'X', h .. 'T', h .. 'Z', h .. 'I')
    if nts > 0 then
      for x = 1, #tsargs, 2 do
        redis.call('HSET', h .. 'T', tsargs[x], tsargs[x + 1])
      end
    end
  end
  for x = 0, ntimers - 1 do
    local base = tstart + 4 * x
    local h = '{' .. P .. ':' .. a[base] .. '}'
    local k, d = a[base + 1], a[base + 2]
    redis.call('HSET', h .. 'm:' .. k, 'd', d, 'w', a[base + 3])
    redis.call('ZADD', h .. 'Z', 0, d .. k)
    redis.call('SADD', h .. 'K', k)
  end
  for x = 0, nlog - 1 do
    local base = lstart + 5 * x
    local h = '{' .. P .. ':' .. a[base] .. '}'
    local logid, k = a[base + 1], a[base + 3]
    redis.call('HSET', h .. 'L', logid, a[base + 2])
    if k ~= '' then
      redis.call('HSET', h .. 'b:' .. k, logid, a[base + 4])
      redis.call('ZADD', h .. 'X', 0, logid .. '+' .. k)
    else
      redis.call('ZADD', h .. 'X', 0, logid)
    end
  end
  while i <= #a do
    local h = '{' .. P .. ':' .. a[i] .. '}'
    local e = entry(h, a[i + 1])
    local form, j = read_form(a, i + 2)
    write_form(e, form)
    bump(e)
    i = j
  end
  return 'OK'
end

redis.register_function { function_name = 'sluice_dump', callback = dump, flags = { 'allow-cross-slot-keys' } }
redis.register_function { function_name = 'sluice_restore', callback = restore, flags = { 'allow-cross-slot-keys' } }
