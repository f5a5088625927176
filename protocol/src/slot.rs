//! Hash slots, exactly as Redis Cluster computes them: CRC16 (XMODEM) of
//! the key, or of its hash tag, modulo 16384.
//!
//! Idem runs one Raft group that owns every slot today; the slot is what a
//! `-MOVED slot host:port` redirect names, so that stock Redis Cluster
//! clients route to the leader. Splitting the key space over several
//! groups later keeps the same function, so keys never change slot.

/// Number of hash slots.
pub const SLOTS: u16 = 16_384;

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum
/// Redis Cluster uses for slots.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The part of `key` that is hashed: the text between the first `{` and
/// the first `}` after it, when that is not empty; otherwise the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// The hash slot of `key` (0..16384).
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_is_xmodem() {
        // The check value of CRC-16/XMODEM, the one Redis's crc16.c cites.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn slots_match_redis_cluster() {
        // Values from redis-cli's CLUSTER KEYSLOT on Redis 7.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"hello"), 866);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn hash_tags_follow_the_redis_rules() {
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_eq!(key_slot(b"{user1000}.x"), key_slot(b"user1000"));
        // An empty tag hashes the whole key.
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        // Only the first `{` and the first `}` after it count.
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        // No closing brace: the whole key.
        assert_eq!(hash_tag(b"foo{bar"), b"foo{bar");
    }
}
