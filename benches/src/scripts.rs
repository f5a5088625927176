//! Idempotency on Redis as it is deployed today: Lua scripts run by
//! EVALSHA. A record is one string: `F:<fence>` while in flight (with the
//! lease as its TTL), `C:<value>` once completed (with the retention as its
//! TTL). Fences come from one counter key.

/// Claim with result: acquire (with a fence), replay, or report in flight.
/// `KEYS[1]` = key, `ARGV[1]` = lease ms.
pub const CLAIM: &str = r#"
local v = redis.call('GET', KEYS[1])
if not v then
  local fence = redis.call('INCR', 'idem:fence')
  redis.call('SET', KEYS[1], 'F:' .. fence, 'PX', ARGV[1])
  return {'ACQUIRED', fence}
end
if string.sub(v, 1, 2) == 'F:' then
  return {'INFLIGHT', redis.call('PTTL', KEYS[1])}
end
return {'COMPLETED', string.sub(v, 3)}
"#;

/// Fenced complete: compare-and-set from `F:<fence>` to `C:<value>`.
/// `KEYS[1]` = key, `ARGV[1]` = fence, `ARGV[2]` = value, `ARGV[3]` = retain ms.
pub const COMPLETE: &str = r#"
local v = redis.call('GET', KEYS[1])
if v == 'F:' .. ARGV[1] then
  redis.call('SET', KEYS[1], 'C:' .. ARGV[2], 'PX', ARGV[3])
  return 'OK'
end
return redis.error_reply('FENCED key is not held by this fence')
"#;
